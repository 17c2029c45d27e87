"""Replay recorded measurements through the search protocols.

`RecordedAcceptance` serves acceptance rows scored earlier (an acceptance CSV of a run);
`RecordedLatency` serves latencies from a table. Together they re-run a search, or compare
strategies on the same numbers, without a model (the search benchmark does this).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dreams_nas.latency.model.query import ScalarLatency
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec


class RecordedAcceptance:
    """An `AcceptanceScorer` over rows scored earlier; counts what it is asked for."""

    def __init__(self, rows: Iterable[AcceptanceRow]) -> None:
        self._rows = {r.spec: r for r in rows}
        self.calls: list[SubnetSpec] = []

    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        missing = [s.id for s in specs if s not in self._rows]
        if missing:
            raise InputError(
                f"no recorded acceptance for {missing[:5]}; score them with `dreams-nas score`"
            )
        self.calls.extend(specs)
        return [self._rows[s] for s in specs]


def _arch_key(key: Sequence[Any]) -> tuple[int, float, int, int, float, float]:
    """(heads, visual_keep, inject_layer, depth, mlp, draft_vocab) of a recorded key. The keys
    are an in-memory table a caller writes, not a file: a short key leaves out the paper's
    sizes (`SIZE_DEFAULTS`), so three fields are depth 1 with the whole MLP and vocabulary, and
    five predict over the whole vocabulary."""
    h, v, lyr, *size = key
    if len(size) not in (0, 2, 3):
        raise InputError(f"recorded draft latency key {tuple(key)!r} must be (heads, visual_keep, "
                         "inject_layer), (heads, visual_keep, inject_layer, depth, mlp) or "
                         "(heads, visual_keep, inject_layer, depth, mlp, draft_vocab)")
    depth, mlp, vocab = (*size, *(1, 1.0, 1.0)[len(size):])
    return int(h), float(v), int(lyr), int(depth), float(mlp), float(vocab)


class RecordedLatency(ScalarLatency):
    """A `LatencyModel` over a table (no cycle kinds: a replay prices no cycle overhead).

    draft:  (heads, visual_keep, inject_layer[, depth, mlp[, draft_vocab]]) -> ms of one draft
            step (also served for "draft_first", the cycle's first step, unless `first_draft`
            records it); a key without depth and mlp is the draft of depth 1 with the whole
            MLP, one without draft_vocab predicts over the whole vocabulary
    verify: k -> ms of one target pass over k positions
    decode: ms of one plain target step
    """

    def __init__(self, draft: Mapping[tuple[Any, ...], float],
                 verify: Mapping[int, float], decode: float,
                 first_draft: Mapping[tuple[Any, ...], float] | None = None) -> None:
        self.draft = {_arch_key(key): float(ms) for key, ms in draft.items()}
        self.first_draft = {_arch_key(key): float(ms)
                            for key, ms in (first_draft or {}).items()}
        self.verify = {int(k): float(ms) for k, ms in verify.items()}
        self.decode = float(decode)

    def prices(self, kind: str) -> bool:
        return kind in ("draft", "draft_first", "decode", "verify")

    def step_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        if kind == "decode":
            return self.decode
        if kind == "verify":
            if k not in self.verify:
                raise InputError(f"no recorded verify latency for k={k}; "
                                 f"recorded: {sorted(self.verify)}")
            return self.verify[k]
        if kind in ("draft", "draft_first") and spec is not None:
            key = (spec.heads, spec.visual_keep, spec.inject_layer, spec.depth, spec.mlp,
                   spec.draft_vocab)
            if kind == "draft_first" and key in self.first_draft:
                return self.first_draft[key]
            if key not in self.draft:
                raise InputError(f"no recorded draft latency for {spec.id}")
            return self.draft[key]
        raise InputError(f"latency kind {kind!r} is not one of "
                         "['draft', 'draft_first', 'verify', 'decode']")
