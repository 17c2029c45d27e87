"""The sampler side of a shared study: each worker's seed, and proposals steered off the
subnets the study already holds (`DistinctSampler`), so that parallel workers do not propose
one another's subnets."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

PROPOSALS = 3  # tries of the inner sampler before a held subnet is replaced by a random one
_HELD = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)


def distribution_of(values: Sequence[Any]) -> BaseDistribution:
    """How a subnet field is sampled: integers that form an arithmetic progression (draft
    lengths 1..7, layers 4, 8, 12, 16) as an ordinal `IntDistribution`, so TPE's kernel carries
    what it learns to neighbouring values; anything else (visual_keep fractions, heads 1, 2, 4,
    8) as categorical."""
    items = sorted(set(values))
    if len(items) >= 3 and all(isinstance(v, int | np.integer) and not isinstance(v, bool)
                               for v in items):
        steps = {b - a for a, b in itertools.pairwise(items)}
        if len(steps) == 1:
            return IntDistribution(int(items[0]), int(items[-1]), step=int(steps.pop()))
    return CategoricalDistribution(list(values))


def choices_of(dist: BaseDistribution) -> list[Any]:
    """Every value `dist` can take (a subnet field's values)."""
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    raise TypeError(f"a subnet field cannot be sampled from {dist!r}")


def suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """`trial`'s value of one subnet field, through the public suggest API."""
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step)
    return trial.suggest_categorical(name, choices_of(dist))


def worker_seed(study_name: str, seed: int, ordinal: int) -> int:
    """The sampler seed of the `ordinal`-th worker of a study run with `--seed seed`: workers
    differ, and the same command on a fresh storage samples the same subnets."""
    digest = hashlib.sha256(f"{study_name}\0{int(seed)}\0{int(ordinal)}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def key_digest(key: Mapping[str, Any]) -> str:
    """A short, stable digest of a study key (it ends the default study name)."""
    text = json.dumps(dict(key), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


class DistinctSampler(optuna.samplers.BaseSampler):
    """`inner`'s proposals, steered off subnets the study already holds.

    Parallel workers (and a converged TPE) keep proposing subnets that are scored or being
    scored; each such trial only copies figures. Every subnet is sampled jointly here, and a
    proposal stands only once `reserve(params)` has claimed it (atomically, in the claims
    table): the `first` subnets while one is unheld (a killed worker's unfinished subnets,
    then the largest and the smallest), then `inner`'s proposals; when `inner`
    proposes a held subnet `PROPOSALS` times, a random unheld one is taken instead (seeded by
    the trial number, so a lone worker stays reproducible).

    `first` replaces `Study.enqueue_trial`: on SQLite two workers can pop the same enqueued
    trial (its row lock is a no-op there) and one of them then fails to finish it.
    """

    def __init__(self, inner: optuna.samplers.BaseSampler,
                 distributions: Mapping[str, BaseDistribution], seed: int,
                 reserve: Callable[[dict[str, Any]], bool] = lambda params: True,
                 first: Sequence[Mapping[str, Any]] = ()) -> None:
        self._inner = inner
        self._distributions = dict(distributions)
        self._seed = int(seed)
        self._reserve = reserve
        self._first = [dict(p) for p in first]

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return dict(self._distributions)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if "fixed_params" in trial.system_attrs:
            return {}  # a queued trial (a dead worker's, retried): its subnet is given
        held = self._held(study, trial)
        for params in self._first:
            if self._take(dict(params), held):
                return dict(params)
        params: dict[str, Any] = {}
        for _ in range(PROPOSALS):
            params = self._propose(study, trial)
            if self._take(params, held):
                return params
        rng = np.random.default_rng([self._seed, int(trial.number)])
        while (other := self._unheld(held, rng)) is not None:
            if self._take(other, held):
                return other
        return params  # the study holds every subnet: this trial copies one

    def _take(self, params: dict[str, Any], held: set[tuple[Any, ...]]) -> bool:
        """Reserve `params` unless held; a subnet reserved elsewhere joins `held`."""
        key = self._key(params)
        if key is None or key in held:
            return False
        if self._reserve(params):
            return True
        held.add(key)
        return False

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._inner.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        space = self._inner.infer_relative_search_space(study, trial)
        params = dict(self._inner.sample_relative(study, trial, space)) if space else {}
        for name, dist in self._distributions.items():
            if name not in params:
                params[name] = self._inner.sample_independent(study, trial, name, dist)
        return params

    def _key(self, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        if any(name not in params for name in self._distributions):
            return None
        return tuple(params[name] for name in self._distributions)

    def _held(self, study: optuna.Study, trial: FrozenTrial) -> set[tuple[Any, ...]]:
        """Subnets of scored, running and enqueued trials other than `trial`."""
        held = set()
        for t in study.get_trials(deepcopy=False, states=_HELD):
            if t.number == trial.number:
                continue
            fixed = t.system_attrs.get("fixed_params") if t.state == TrialState.WAITING else None
            key = self._key(fixed if isinstance(fixed, dict) else t.params)
            if key is not None:
                held.add(key)
        return held

    def _unheld(self, held: set[tuple[Any, ...]], rng: np.random.Generator
                ) -> dict[str, Any] | None:
        """A random subnet outside `held` (None when the study holds every one)."""
        names = list(self._distributions)
        choices = [choices_of(self._distributions[n]) for n in names]
        for _ in range(64):
            key = tuple(c[int(rng.integers(len(c)))] for c in choices)
            if key not in held:
                return dict(zip(names, key, strict=True))
        free = [k for k in itertools.product(*choices) if k not in held]
        if not free:
            return None
        return dict(zip(names, free[int(rng.integers(len(free)))], strict=True))
