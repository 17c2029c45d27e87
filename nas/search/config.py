"""How a search runs (`SearchConfig`): the options of `strategies.search`, validated once, as
HF's `GenerationConfig` carries generation's. Model-free: what a search prices subnets with is
a `candidate.Pricing`."""

from __future__ import annotations

from dataclasses import dataclass

from dreams_nas.nas.search.candidate import DEFAULT_FRONT, FRONTS
from dreams_nas.supernet.core.errors import InputError

OBJECTIVES = ("speedup", "pareto")
SEARCH_METHODS = ("exhaustive", "optuna")


def check_front(front: str) -> str:
    if front not in FRONTS:
        raise InputError(f"front {front!r} is not one of {list(FRONTS)}")
    return front


@dataclass(frozen=True)
class SearchConfig:
    """How to search (model-free: what is searched with comes in a `Pricing`).

    objective:    ``speedup`` or ``pareto`` (a front over the `FRONTS` pair `front`).
    method:       ``exhaustive`` or ``optuna``.
    front:        the `FRONTS` pair of the result's front (and of ``pareto``'s two objectives).
    max_draft_ms: subnets whose draft step is slower are infeasible.
    n_trials:     optuna: distinct subnets to evaluate in the study, all workers and reruns
                  together (default: a quarter of the space).
    storage:      Optuna storage URL or ``journal:PATH``; None = in memory (exhaustive: in this
                  process).
    study_name:   None: `default_study_name`, ended by the study key's digest.
    seed:         the sampler's seed (each worker of a shared study derives its own).
    wait_s:       distributed runs: how long to wait for other workers' subnets at the end.
    show_progress: a progress bar on stderr (None: when stderr is a terminal).
    """

    objective: str = "speedup"
    method: str = "exhaustive"
    front: str = DEFAULT_FRONT
    max_draft_ms: float | None = None
    n_trials: int | None = None
    storage: str | None = None
    study_name: str | None = None
    seed: int = 0
    wait_s: float = 600.0
    show_progress: bool | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InputError(f"objective {self.objective!r} is not one of {list(OBJECTIVES)}")
        if self.method not in SEARCH_METHODS:
            raise InputError(f"method {self.method!r} is not one of {list(SEARCH_METHODS)}")
        if self.max_draft_ms is not None and not self.max_draft_ms > 0:
            raise InputError(f"max_draft_ms={self.max_draft_ms} must be a positive number of ms")
        if self.n_trials is not None and self.n_trials < 1:
            raise InputError(f"n_trials={self.n_trials} must be at least 1")
        check_front(self.front)
