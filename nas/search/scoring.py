"""Acceptance rows on demand: read the cache, score only what is missing, append as we go."""

from __future__ import annotations

from collections.abc import Sequence

from dreams_nas.nas.search.candidate import AcceptanceScorer
from dreams_nas.supernet.acceptance.table import AcceptanceRow, AcceptanceTable
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.space import SubnetSpec


class CachedAcceptance:
    """Wraps a scorer with the acceptance CSV of the run (or an in-memory dict without one).

    A scorer may return rows for more specs than asked (the teacher-forced scorer gets every
    draft_len of a (heads, visual_keep, inject_layer) triple from one pass): all are cached.
    """

    def __init__(self, scorer: AcceptanceScorer, table: AcceptanceTable | None = None,
                 batch_size: int = 8) -> None:
        self.scorer = scorer
        self.table = table
        self.batch_size = max(1, int(batch_size))
        self._rows: dict[SubnetSpec, AcceptanceRow] = table.load() if table is not None else {}
        self.n_scored = 0  # rows this object had the scorer compute (not from the cache)

    def cached(self, spec: SubnetSpec) -> AcceptanceRow | None:
        return self._rows.get(spec)

    def refresh(self) -> None:
        """Re-read the CSV (other workers append to it too)."""
        if self.table is not None:
            self._rows.update(self.table.load())

    def rows(self, specs: Sequence[SubnetSpec], *, show_progress: bool | None = None,
             desc: str = "scoring acceptance") -> list[AcceptanceRow]:
        missing = [s for s in dict.fromkeys(specs) if s not in self._rows]
        if missing and self.table is not None:
            self.refresh()  # another worker may have scored them since we loaded
            missing = [s for s in missing if s not in self._rows]
        if missing:
            bar = progress(total=len(missing), desc=desc, unit="subnet",
                           disable=None if show_progress is None else not show_progress)
            try:
                for start in range(0, len(missing), self.batch_size):
                    batch = [s for s in missing[start : start + self.batch_size]
                             if s not in self._rows]
                    if batch:
                        self._store(self.scorer.score(batch), batch)
                    bar.update(len(missing[start : start + self.batch_size]))
            finally:
                bar.close()
        return [self._rows[s] for s in specs]

    def _store(self, new: Sequence[AcceptanceRow], asked: Sequence[SubnetSpec]) -> None:
        got = {r.spec for r in new}
        lost = [s.id for s in asked if s not in got]
        if lost:
            raise RuntimeError(f"the acceptance scorer returned no row for {lost}")
        fresh = [r for r in new if r.spec not in self._rows]
        if self.table is not None and fresh:
            self.table.append(fresh)
        for r in new:
            self._rows[r.spec] = r
        self.n_scored += len(fresh)
