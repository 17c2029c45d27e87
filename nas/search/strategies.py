"""The search: one function, two strategies, the same candidate type.

* ``exhaustive`` evaluates every subnet of the space (vectorised); it scores whichever
  acceptance rows the cache lacks. With a shared ``storage`` it becomes a distributed sweep:
  workers claim subnets atomically in the shared database and the union covers the space.
* ``optuna`` runs a real Optuna study (TPE; multi-objective TPE for ``pareto``), seeded, with
  the largest and smallest subnets enqueued first; each trial scores one subnet's tau and
  predicts its latency. Storage is any Optuna URL (SQLite in the run folder by default from
  the CLI; ``postgresql://...`` or ``journal:PATH`` lets several workers share one study,
  see `storage.py`); a rerun continues it, and workers do not propose each other's subnets.

Objectives: ``speedup`` (maximise) and ``pareto``, a front over one of the pairs in `FRONTS`
(``front``): ``tau-latency`` (acceptance tau vs the cycle's latency: model quality vs hardware
cost, the default), ``speedup-memory`` (speedup vs the draft's memory, weights + KV at the
context) or ``speedup-params`` (speedup vs draft parameters). Every search records the front of
its pair; ``max_draft_ms`` makes subnets whose draft step is slower infeasible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from dreams_nas.latency.model.query import MemoizedLatency
from dreams_nas.nas.search.candidate import (
    DEFAULT_FRONT,
    FRONTS,
    AcceptanceScorer,
    Candidate,
    Pricing,
)
from dreams_nas.nas.search.candidate import evaluate as evaluate_rows
from dreams_nas.nas.search.config import SearchConfig, check_front
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.pareto import is_pareto_front
from dreams_nas.supernet.core.space import SearchSpace

FRONT_DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class SearchResult:
    objective: str
    method: str
    candidates: tuple[Candidate, ...]  # every evaluated subnet, in evaluation order
    front: tuple[Candidate, ...]  # feasible, non-dominated in the pair `front_axes` names
    best: Candidate | None  # highest feasible speedup (ties: fewer parameters)
    space_size: int
    n_scored: int  # acceptance rows this process had to compute (cache misses)
    study_name: str | None = None
    storage: str | None = None  # redacted: no password
    history: tuple[tuple[int, float, float], ...] = field(default=())  # number, value, best
    front_axes: str = DEFAULT_FRONT  # the FRONTS pair of `front`

    @property
    def n_evaluations(self) -> int:
        return len(self.candidates)


def pareto_front(candidates: Sequence[Candidate], front: str = DEFAULT_FRONT) -> list[Candidate]:
    """Feasible candidates not dominated in the `front` pair (first maximised, second
    minimised), by the first axis, best first."""
    high, low = FRONTS[check_front(front)]
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        return []
    values = np.array([[c.value(high), c.value(low)] for c in feasible], dtype=np.float64)
    mask = is_pareto_front(values, FRONT_DIRECTIONS)
    on = [c for c, keep in zip(feasible, mask, strict=True) if keep]
    return sorted(on, key=lambda c: (-c.value(high), c.value(low), c.spec))


def best_candidate(candidates: Sequence[Candidate]) -> Candidate | None:
    feasible = [c for c in candidates if c.feasible and np.isfinite(c.speedup)]
    if not feasible:
        return None
    return min(feasible, key=lambda c: (-c.speedup, c.draft_params, c.spec))


def history_of(candidates: Sequence[Candidate]) -> tuple[tuple[int, float, float], ...]:
    """(number, speedup, best feasible speedup so far) in evaluation order."""
    out = []
    best = -np.inf
    for c in sorted(candidates, key=lambda c: c.number):
        if c.feasible:
            best = max(best, c.speedup)
        out.append((c.number, c.speedup, float(best) if np.isfinite(best) else float("nan")))
    return tuple(out)


def search(space: SearchSpace, acceptance: AcceptanceScorer | CachedAcceptance,
           pricing: Pricing, config: SearchConfig = SearchConfig(), *,
           study_key: Mapping[str, Any] | None = None) -> SearchResult:
    """Search `space` for the subnet(s) with the best expected speedup.

    acceptance: a scorer, or a `CachedAcceptance` (the run's acceptance CSV + a scorer).
    pricing:    the latency model of one hardware id at the mean decoding context (the eval
                prompts' length plus half their answers, see `inputs.context_len_of`), and
                each subnet's draft parameters and memory (the fronts' cost axes).
    study_key:  the inputs the figures depend on beyond the space and objective (latency
                predictor, context, dtype...): stored with the study, a study of another key is
                refused, and it ends the default study name (new inputs, new study).
    """
    if config.front == "speedup-memory" and pricing.cost.memory is None:
        raise InputError("the speedup-memory front needs each draft's memory (DraftCost.memory)")
    cached = (acceptance if isinstance(acceptance, CachedAcceptance)
              else CachedAcceptance(acceptance))
    pricing = replace(pricing, latency=MemoizedLatency(pricing.latency))
    cached.use_space(space)
    if config.method == "exhaustive" and config.storage is None:
        return _exhaustive_local(space, cached, pricing, config)
    from dreams_nas.nas.search.sampler import key_digest
    from dreams_nas.nas.search.storage import redact, secrets_hidden
    from dreams_nas.nas.search.study import StudyRunner

    if config.study_name is None:
        name = default_study_name(config.objective, config.max_draft_ms, config.method,
                                  config.front)
        config = replace(config, study_name=name if study_key is None
                         else f"{name}-{key_digest(study_key)}")
    with secrets_hidden(config.storage):
        runner = StudyRunner(space, cached, pricing, config, key=study_key)
        try:
            if config.method == "exhaustive":
                candidates = runner.sweep(wait_s=config.wait_s)
            else:
                budget = config.n_trials if config.n_trials is not None else max(1,
                                                                               space.size // 4)
                candidates = runner.optimize(min(budget, space.size), wait_s=config.wait_s)
            cached.sync_table()  # rows other workers scored join this run's CSV
        finally:
            runner.close()
    return _result(config, candidates, space.size, cached.n_scored,
                   study_name=runner.study_name, storage=redact(config.storage))


def default_study_name(objective: str, max_draft_ms: float | None,
                       method: str = "optuna", front: str = DEFAULT_FRONT) -> str:
    """``dreams-nas-<objective>`` for Optuna, ``dreams-nas-sweep-<objective>`` for the shared
    exhaustive sweep (its trials are architectures, not subnets); ``pareto`` names its front pair
    (``dreams-nas-pareto-tau-latency``); then the draft-time limit."""
    kind = "sweep-" if method == "exhaustive" else ""
    goal = f"pareto-{front}" if objective == "pareto" else objective
    name = f"dreams-nas-{kind}{goal}"
    return name if max_draft_ms is None else f"{name}-max-draft-{max_draft_ms:g}ms"


def _exhaustive_local(space: SearchSpace, cached: CachedAcceptance, pricing: Pricing,
                      config: SearchConfig) -> SearchResult:
    specs = list(space.enumerate())
    rows = cached.rows(specs, show_progress=config.show_progress)
    candidates = evaluate_rows(rows, pricing, max_draft_ms=config.max_draft_ms)
    return _result(config, candidates, space.size, cached.n_scored)


def _result(config: SearchConfig, candidates: Sequence[Candidate], space_size: int,
            n_scored: int, *, study_name: str | None = None,
            storage: str | None = None) -> SearchResult:
    ordered = tuple(sorted(candidates, key=lambda c: c.number))
    return SearchResult(
        objective=config.objective, method=config.method, candidates=ordered,
        front=tuple(pareto_front(ordered, config.front)), best=best_candidate(ordered),
        space_size=space_size, n_scored=n_scored, study_name=study_name, storage=storage,
        history=history_of(ordered) if config.method == "optuna" else (),
        front_axes=config.front,
    )
