"""`dreams-nas profile --transfer-from`: price a new device from the profiles of devices
already profiled in full and a few steps measured here (`latency.model.transfer`).

The sources are ``<run>/latency/<hardware-id>/`` folders (of this run or another) holding a
predictor fitted on that device's own full profile. Their plan (space, contexts, budget, seed)
gives the candidate steps, the steps a full profile here would time; `transfer.choose_rows`
picks the N most informative of them, which are timed here exactly as a profile times them
(repeats, passes, interleaving) and appended to this device's profile.csv. The transfer is
fitted on every measured row this device's profile holds, each candidate step is priced through
it, and the device's predictor is fitted on those prices like any other: predictor.json records
its sources, N and the transfer's leave-one-out accuracy on the measured steps; its rows stay in
profile.csv, so a later `dreams-nas profile` without `--transfer-from` on this device times the
rest of the grid and replaces the transferred predictor with one of its own.

A transfer between programs that are not the same is refused in one line: a source of another
target architecture, draft space, dtype, step revision or compile mode, a source that is itself
transferred, and this device's own folder.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from dreams_nas.latency.measure.plan import StepKey, build_plan
from dreams_nas.latency.model.draft_regression import latency_metrics
from dreams_nas.latency.model.persist import training_frame
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.latency.model.transfer import LatencyTransfer, choose_rows, leave_one_out
from dreams_nas.latency.model.validation import metric_kinds, metrics_by_kind
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.space import SearchSpace

if TYPE_CHECKING:
    from dreams_nas.latency.measure.profile_store import ProfileStore

log = logging.getLogger("dreams_nas.latency")
DEFAULT_BUDGET = 10  # steps measured here when --budget is not given
# Up to this many measured steps the reported leave-one-out is nested (each fit left out chooses
# its own terms, as the full fit did: O(N^2) fits); beyond it, the full fit's terms are kept.
NESTED_LOO_MAX = 30
# What a source's rows must share with this device's: the program that was timed.
MATCH_KEYS = ("dtype", "architecture_hash", "step_revision", "steps")
_FIX = "transfer from a profile of this run's target, space and dtype, or profile in full"


@dataclass(frozen=True)
class Source:
    """One source device: its folder, fitted predictor and plan.json."""

    folder: Path
    predictor: LatencyPredictor
    plan: dict[str, Any]

    @property
    def hardware_id(self) -> str:
        return self.predictor.hardware_id


def load_sources(paths: Sequence[str | Path], here: Path, fingerprint: Mapping[str, Any]
                 ) -> list[Source]:
    """The source folders, each refused in one line unless it holds a predictor fitted on its
    own full profile of the same program (`MATCH_KEYS` of `fingerprint`) and is not `here`."""
    sources = []
    for given in paths:
        folder = Path(given).expanduser().resolve()  # recorded: --fit-only runs from anywhere
        where = f"--transfer-from {given}"
        if not (folder / "predictor.json").is_file() or not (folder / "plan.json").is_file():
            raise InputError(f"{where} is not a profiled device's folder (<run>/latency/"
                             "<hardware-id> with predictor.json and plan.json); run `dreams-nas "
                             "profile` on that device first")
        if folder == here.resolve():
            raise InputError(f"{where} is this device's own profile; transfer from another "
                             "device's")
        predictor = LatencyPredictor.load(folder)
        if predictor.transfer:
            raise InputError(f"{where} holds a transferred predictor (its prices are themselves "
                             "predicted); transfer from a device profiled in full")
        for key in MATCH_KEYS:
            have, want = predictor.fingerprint.get(key), fingerprint.get(key)
            if key == "steps" and have is None:  # a profile from before compiled steps
                have = "dynamic"
            if key in ("dtype", "architecture_hash") and have is None:
                raise InputError(f"{where} does not record the {key} it was timed with; {_FIX}")
            if str(have) != str(want) and not (have is None and want is None):
                raise InputError(f"{where} was timed with {key} {have}, this device with "
                                 f"{want}: its prices are another program's; {_FIX}")
        plan = read_json(folder / "plan.json")
        if not isinstance(plan, dict) or not plan.get("space") or not plan.get("context_lengths") \
                or not isinstance(plan.get("visual_tokens"), int):
            raise InputError(f"{folder / 'plan.json'} names no space, context lengths and visual "
                             f"tokens; rerun `dreams-nas profile` on {predictor.hardware_id}")
        if sources and [plan["context_lengths"], plan["visual_tokens"]] != [
                sources[0].plan["context_lengths"], sources[0].plan["visual_tokens"]]:
            raise InputError(f"{where} was profiled at contexts {plan['context_lengths']} "
                             f"({plan['visual_tokens']} visual tokens), --transfer-from "
                             f"{paths[0]} at {sources[0].plan['context_lengths']} "
                             f"({sources[0].plan['visual_tokens']}): one source would be "
                             "extrapolated; give sources profiled alike")
        sources.append(Source(folder, predictor, plan))
    if len({s.hardware_id for s in sources}) < len(sources):
        raise InputError("--transfer-from names one hardware id twice; give each device once")
    return sources


def check_space(sources: Sequence[Source], space: SearchSpace) -> None:
    """Refuse a source profiled over another draft space than this run's."""
    for source in sources:
        if SearchSpace.from_dict(source.plan["space"]).to_dict() != space.to_dict():
            raise InputError(f"--transfer-from {source.folder} profiled another draft space than "
                             f"this run's ({source.plan['space']} against {space.to_dict()}); "
                             f"{_FIX}")


def candidate_keys(source: Source) -> list[StepKey]:
    """The steps a full profile here would time: the first source's plan."""
    plan = source.plan
    return build_plan(SearchSpace.from_dict(plan["space"]), plan["context_lengths"],
                      budget=plan.get("budget"), seed=int(plan.get("seed", 0)))


def keys_frame(keys: Sequence[StepKey]) -> pd.DataFrame:
    """The steps as the predictor's rows (kind, spec fields, context_len, k; no time)."""
    nan = float("nan")
    return pd.DataFrame([{
        "kind": k.kind, "spec_id": k.spec_id,
        "heads": nan if k.spec is None else k.spec.heads,
        "visual_keep": nan if k.spec is None else k.spec.visual_keep,
        "depth": nan if k.spec is None else k.spec.depth,
        "mlp": nan if k.spec is None else k.spec.mlp,
        "draft_vocab": nan if k.spec is None else k.spec.draft_vocab,
        "context_len": k.context_len, "k": k.k} for k in keys])


def source_prices(sources: Sequence[Source], rows: pd.DataFrame) -> np.ndarray:
    """(rows, sources) each source's predicted milliseconds of `rows`."""
    return np.column_stack([s.predictor.predict_rows(rows) for s in sources])


def transfer_budget(budget: float | int | str | None, candidates: int, option: str) -> int:
    """Steps to measure: `budget` as a count or a fraction of the candidates; DEFAULT_BUDGET
    without one. As many as a full profile times is refused: that is a full profile."""
    from dreams_nas.latency.measure.plan import parse_budget

    value = parse_budget(budget, option)
    if value is None:
        return min(DEFAULT_BUDGET, candidates - 1)
    n = max(1, int(np.ceil(value * candidates)) if value < 1 else int(value))
    if n >= candidates:
        raise InputError(f"{option} {budget} asks for {n} steps, as many as a full profile times "
                         f"({candidates}): profile in full (leave out --transfer-from)")
    return n


def choose_keys(sources: Sequence[Source], candidates: Sequence[StepKey], measured: set[Any],
                failed: set[Any], n: int, recorded: Mapping[str, Any] | None) -> list[StepKey]:
    """The N candidate steps to measure here (those already measured count toward N, those that
    failed here are not chosen again): the ones plan.json recorded for the same sources and N (a
    resumed transfer), else `choose_rows`."""
    idents = [list(k.ident) for k in candidates]
    names = [s.hardware_id for s in sources]
    if recorded and recorded.get("sources") == names and recorded.get("n") == n \
            and all(list(i) in idents for i in recorded.get("keys", [])):
        return [candidates[idents.index(list(i))] for i in recorded["keys"]]
    frame = keys_frame(candidates)
    taken = [i for i, k in enumerate(candidates) if k.ident in measured]
    more = choose_rows(metric_kinds(frame), source_prices(sources, frame),
                       max(0, n - len(taken)), taken=taken,
                       exclude=[i for i, k in enumerate(candidates) if k.ident in failed])
    return [candidates[i] for i in sorted({*taken, *more})]


def fit_transfer(sources: Sequence[Source], store: ProfileStore, hardware_id: str, *,
                 visual_tokens: int, stat: str, seed: int, fingerprint: Mapping[str, Any]
                 ) -> LatencyPredictor:
    """This device's predictor: every candidate step priced by the transfer fitted on every
    measured row of `store`, with the transfer's leave-one-out accuracy on those rows as its
    metrics."""
    candidates = keys_frame(candidate_keys(sources[0]))
    measured = training_frame(store.ok_rows().assign(median_ms=lambda f: f[stat]), stat)
    if measured.empty:
        raise InputError(f"no step of {store.path} was timed successfully; the transfer has "
                         "nothing to fit (rerun `dreams-nas profile --transfer-from ...`)")
    cand_kinds, kinds = metric_kinds(candidates), metric_kinds(measured)
    cand_x, x = source_prices(sources, candidates), source_prices(sources, measured)
    y = measured["median_ms"].to_numpy(dtype=float)
    model = LatencyTransfer.fit(cand_kinds, cand_x, kinds, x, y)
    loo = leave_one_out(cand_kinds, cand_x, kinds, x, y,
                        levels=None if len(y) <= NESTED_LOO_MAX else model.design.levels)
    mapped = candidates.assign(median_ms=model.predict(cand_kinds, cand_x))
    predictor = LatencyPredictor.fit(mapped.assign(**{stat: mapped["median_ms"]}), hardware_id,
                                     visual_tokens=visual_tokens, holdout=0.0, seed=seed,
                                     stat=stat, fingerprint=fingerprint)
    if len(y) >= 2:
        predictor.metrics = latency_metrics(y, loo)
        # a kind of one or two measured steps has no accuracy worth the name
        predictor.metrics_by_kind = {kind: m for kind, m in
                                     metrics_by_kind(measured, y, loo).items() if m["n"] >= 3}
        predictor.holdout = [
            {"kind": r.kind, "spec_id": r.spec_id or None, "context_len": int(r.context_len),
             "k": int(r.k), "measured_ms": float(m), "predicted_ms": float(p)}
            for r, m, p in zip(measured.itertuples(index=False), y, loo, strict=True)]
    predictor.transfer = {
        "sources": [{"hardware_id": s.hardware_id, "folder": str(s.folder),
                     "created": read_json(s.folder / "predictor.json").get("created")}
                    for s in sources],
        "measured": int(len(y)), "candidates": int(len(candidates)),
        "holdout": "each measured step left out of the transfer in turn",
        "model": model.summary(),
        # what is served: the predictor fitted on the transferred prices, on the measured steps
        "served": {k: round(v, 4) for k, v in latency_metrics(
            y, predictor.predict_rows(measured)).items()},
    }
    return predictor


def check_transfer(sources: Sequence[Source], store: ProfileStore, *,
                   budget: float | int | str | None, budget_option: str,
                   context_lengths: Sequence[int] | None
                   ) -> tuple[list[StepKey], set[Any], set[Any], int]:
    """(the candidate steps, those measured here, those that failed here, N), refused in one
    line where a transfer makes no sense: given contexts, a budget as large as the grid, a
    device whose profile is complete. Loads no model: checked before the target's load."""
    if context_lengths:
        raise InputError("--context-lengths does not go with --transfer-from: a transfer prices "
                         "its sources' contexts; leave it out")
    candidates = candidate_keys(sources[0])
    frame = store.read() if store.exists() else None
    rows = [] if frame is None else [
        ((str(r.kind), str(r.spec_id), int(r.context_len), int(r.k)), r.status == "ok")
        for r in frame.itertuples(index=False)]
    measured = {ident for ident, ok in rows if ok}
    failed = {ident for ident, ok in rows if not ok}
    if all(k.ident in measured for k in candidates):
        raise InputError(f"{store.path} already holds every step a full profile times "
                         f"({len(candidates)}); its own predictor beats a transfer: run "
                         "`dreams-nas profile --fit-only` without --transfer-from")
    n = transfer_budget(budget, len(candidates), budget_option)
    return candidates, measured, failed, n


def plan_transfer(sources: Sequence[Source], space: SearchSpace, store: ProfileStore,
                  folder: Path, *, budget: float | int | str | None, budget_option: str,
                  context_lengths: Sequence[int] | None
                  ) -> tuple[int, list[int], list[StepKey], dict[str, Any]]:
    """A transfer's (visual tokens, contexts, keys to time, plan.json's `transfer` block): the
    first source's plan, and the N candidate steps `choose_keys` picks (N: `budget`)."""
    check_space(sources, space)
    candidates, measured, failed, n = check_transfer(
        sources, store, budget=budget, budget_option=budget_option,
        context_lengths=context_lengths)
    keys = choose_keys(sources, candidates, measured, failed, n,
                       recorded_transfer(folder / "plan.json"))
    plan = sources[0].plan
    log.info("transfer from %s: timing %d of the %d steps a full profile times",
             ", ".join(s.hardware_id for s in sources), len(keys), len(candidates))
    block = {"sources": [s.hardware_id for s in sources],
             "folders": [str(s.folder) for s in sources], "n": n, "candidates": len(candidates),
             "keys": [list(k.ident) for k in keys]}
    return int(plan["visual_tokens"]), list(plan["context_lengths"]), keys, {"transfer": block}


def recorded_transfer(plan_path: Path) -> dict[str, Any] | None:
    """plan.json's `transfer` block (None for a profile of this device's own)."""
    plan = read_json(plan_path) if plan_path.is_file() else {}
    block = plan.get("transfer") if isinstance(plan, dict) else None
    return block if isinstance(block, dict) else None
