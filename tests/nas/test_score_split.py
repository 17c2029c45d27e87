"""`ranks_share` (`nas.stages.score`): the ranks split what rank 0 saw missing, so ranks that
read the acceptance CSV at different moments (a late rank already sees rows a fast one wrote)
still take disjoint shares that cover every missing architecture once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dreams_nas.nas.stages.score import ranks_share
from dreams_nas.supernet.core.dist import World
from dreams_nas.supernet.core.spec import SubnetSpec

SPECS = [SubnetSpec(heads=h, visual_keep=v, inject_layer=j, draft_len=g)
         for h in (2, 4) for v in (0.5, 1.0) for j in (1, 2) for g in (1, 3, 5)]


@dataclass
class Seen:
    """What one rank read from the CSV: the specs it holds rows of."""

    have: set[SubnetSpec]

    def cached(self, spec: SubnetSpec) -> Any:
        return object() if spec in self.have else None


@dataclass(frozen=True)
class Sent(World):
    """A rank whose broadcast returns what rank 0 sent (`zero`)."""

    zero: Any = None

    def broadcast(self, obj: Any) -> Any:
        return obj if self.rank == 0 else self.zero


def test_a_late_rank_that_sees_more_rows_takes_rank_0s_split() -> None:
    early = Seen(set())  # rank 0 read an empty file
    late = Seen({s for s in SPECS if s.heads == 2 and s.inject_layer == 1})  # rank 0 wrote since
    zero = [s.id for s in SPECS]
    shares = [ranks_share(SPECS, early, Sent(rank=0, size=2, zero=zero)),
              ranks_share(SPECS, late, Sent(rank=1, size=2, zero=zero))]
    archs = [{s.arch for s in share} for share in shares]
    assert not archs[0] & archs[1]
    assert archs[0] | archs[1] == {s.arch for s in SPECS}
    assert sorted(s.id for share in shares for s in share) == sorted(s.id for s in SPECS)


def test_one_process_scores_what_it_lacks() -> None:
    seen = Seen({SPECS[0]})
    assert ranks_share(SPECS, seen, World()) == SPECS[1:]
