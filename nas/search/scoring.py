"""Acceptance rows on demand: read the cache, score only what is missing, an architecture at a
time.

The unit of scoring is the architecture (heads, visual_keep, inject_layer, depth, mlp,
draft_vocab: `SubnetSpec.arch`): one teacher-forced pass gives tau for every draft length, so a
miss scores the architecture's every draft length in the space at once (each draft vocabulary
its own architecture). Alone, the rows go to the run's acceptance CSV as they are scored.
Sharing a storage (`share`), a worker first claims the architecture: the winner scores it and
puts its rows in the shared table, the others wait for those rows (taking the architecture over
if its worker dies); rows scored elsewhere reach this run's CSV at the end (`sync_table`), so the
CSV stays the single-machine cache and export.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dreams_nas.nas.search.candidate import AcceptanceScorer
from dreams_nas.nas.search.shared import arch_key, expand
from dreams_nas.supernet.acceptance.table import AcceptanceRow, AcceptanceTable
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec

if TYPE_CHECKING:
    from dreams_nas.nas.search.claims import ClaimLedger
    from dreams_nas.nas.search.shared import SharedRows

POLL_S = 0.2  # how often a worker waiting for another's architecture looks for its rows


class CachedAcceptance:
    """Wraps a scorer with the acceptance CSV of the run (or an in-memory dict without one).

    draft_lens, trees: the space's chains and token trees, scored together with any asked
    shape of an architecture (the search sets them, `use_space`; a scorer may also return more rows
    than asked: all are kept).
    """

    def __init__(self, scorer: AcceptanceScorer, table: AcceptanceTable | None = None,
                 batch_size: int = 8, draft_lens: Sequence[int] = (),
                 trees: Sequence[Sequence[int]] = ()) -> None:
        self.scorer = scorer
        self.table = table
        self.batch_size = max(1, int(batch_size))
        self.draft_lens = tuple(int(g) for g in draft_lens)
        self.trees = tuple(tuple(int(b) for b in t) for t in trees)
        self._rows: dict[SubnetSpec, AcceptanceRow] = table.load() if table is not None else {}
        self._in_table: set[SubnetSpec] = set(self._rows)
        self.n_scored = 0  # rows this object had the scorer compute (not from the cache)
        self.archs_scored: list[str] = []  # architecture claim keys this object scored, in order
        self._shared: SharedRows | None = None
        self._ledger: ClaimLedger | None = None
        self.wait_s = 600.0

    def use_space(self, space: SearchSpace) -> None:
        """Score `space`'s shapes with every architecture, unless the shapes were given."""
        if not self.draft_lens and not self.trees:
            self.draft_lens, self.trees = tuple(space.draft_len), tuple(space.trees)

    # --- sharing ----------------------------------------------------------------------
    def share(self, shared: SharedRows, ledger: ClaimLedger, *, wait_s: float = 600.0) -> None:
        """Score through `shared` rows and `ledger` architecture claims (see the module text)."""
        self._shared, self._ledger, self.wait_s = shared, ledger, float(wait_s)
        self._pull()

    def unshare(self) -> None:
        for part in (self._shared, self._ledger):
            if part is not None:
                part.close()
        self._shared = self._ledger = None

    def _pull(self) -> None:
        if self._shared is not None:
            for row in self._shared.pull():
                self._rows.setdefault(row.spec, row)

    def sync_table(self) -> int:
        """Append to the run's CSV the rows it lacks (scored by other workers). Returns how many."""
        if self.table is None:
            return 0
        self._pull()
        on_disk = set(self.table.load())
        self._in_table |= on_disk
        new = [r for s, r in self._rows.items() if s not in self._in_table]
        if new:
            self.table.append(new)
            self._in_table.update(r.spec for r in new)
        return len(new)

    # --- rows -------------------------------------------------------------------------
    def cached(self, spec: SubnetSpec) -> AcceptanceRow | None:
        return self._rows.get(spec)

    def refresh(self) -> None:
        """Re-read what other workers stored: the shared rows, or the CSV when not sharing."""
        if self._shared is not None:
            self._pull()
        elif self.table is not None:
            loaded = self.table.load()
            self._in_table |= set(loaded)
            self._rows.update(loaded)

    def rows(self, specs: Sequence[SubnetSpec], *, show_progress: bool | None = None,
             desc: str = "scoring acceptance") -> list[AcceptanceRow]:
        missing = [s for s in dict.fromkeys(specs) if s not in self._rows]
        if missing:
            self.refresh()  # another worker may have scored them since we loaded
            missing = [s for s in missing if s not in self._rows]
        if missing:
            archs: dict[SubnetSpec, list[SubnetSpec]] = {}
            for s in missing:
                archs.setdefault(s.arch, []).append(s)
            bar = progress(total=len(archs), desc=desc, unit="triple",
                           disable=None if show_progress is None else not show_progress)
            try:
                if self._shared is None:
                    self._score_local(archs, bar)
                else:
                    for arch, asked in archs.items():
                        self._score_shared(arch, asked)
                        bar.update(1)
            finally:
                bar.close()
        return [self._rows[s] for s in specs]

    def _score_local(self, archs: dict[SubnetSpec, list[SubnetSpec]], bar) -> None:
        items = list(archs.items())
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            asked = [s for arch, wanted in batch
                     for s in expand(arch, self.draft_lens, wanted, self.trees)
                     if s not in self._rows]
            if asked:
                self._store(self.scorer.score(asked), asked)
                self.archs_scored.extend(arch_key(t) for t, _ in batch)
            bar.update(len(batch))

    def _score_shared(self, arch: SubnetSpec, wanted: Sequence[SubnetSpec]) -> None:
        """Score `arch` if this worker wins its claim, else wait for the rows of whoever did
        (and take it over if that worker dies)."""
        assert self._shared is not None and self._ledger is not None
        key = arch_key(arch)
        deadline = time.monotonic() + self.wait_s
        while any(s not in self._rows for s in wanted):
            if self._ledger.claim(key):
                asked = [s for s in expand(arch, self.draft_lens, wanted, self.trees)
                         if s not in self._rows]
                try:
                    with self._ledger.keepalive():
                        rows = self.scorer.score(asked)
                        self._store(rows, asked)
                        self._shared.put(rows)
                except BaseException:
                    self._ledger.release(key)
                    raise
                self._ledger.done(key, 0)
                self.archs_scored.append(key)
                return
            time.sleep(POLL_S)
            self._pull()
            claim = self._ledger.get(key)
            if (claim is not None and claim.state == "done"
                    and any(s not in self._rows for s in wanted)):
                # done, yet without the rows asked (its worker scored other draft lengths):
                # this worker scores the rest under a claim of its own
                self._ledger.release_done(key)
            if time.monotonic() > deadline:
                holder = "nobody" if claim is None else f"worker {claim.worker}"
                raise RuntimeError(
                    f"waited {self.wait_s:.0f} s for the acceptance of {key} held by {holder}; "
                    "that worker may hang: stop it (its claim is then taken over) or raise "
                    "the wait"
                )

    def _store(self, new: Sequence[AcceptanceRow], asked: Sequence[SubnetSpec]) -> None:
        got = {r.spec for r in new}
        lost = [s.id for s in asked if s not in got]
        if lost:
            raise RuntimeError(f"the acceptance scorer returned no row for {lost}")
        fresh = [r for r in new if r.spec not in self._rows]
        if self.table is not None and fresh:
            self.table.append(fresh)
            self._in_table.update(r.spec for r in fresh)
        for r in new:
            self._rows[r.spec] = r
        self.n_scored += len(fresh)
