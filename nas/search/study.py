"""The study-backed strategies: Optuna TPE search and the distributed exhaustive sweep.

Optuna: every evaluated subnet is one COMPLETE trial carrying its figures in user attributes,
so any worker (or `optuna-dashboard`) reads the same results. A subnet's trial is run by the
worker that won its claim (`claims.py`); a trial that samples an already-held subnet copies its
values (user attribute ``duplicate_of``). tau comes from the shared acceptance rows
(`shared.py`): each architecture (heads, visual_keep, inject_layer, depth, mlp, draft_vocab;
named `triple:` in claim names) is scored once, by one worker, whichever of its draft
lengths was proposed first. A space that searches depth, MLP width or the draft vocabulary
samples each of them as one more parameter; one that does not keeps the parameters of before,
so its studies continue as they were.

Sweep (exhaustive over a shared storage): Optuna's `GridSampler` over the architectures, one trial
per architecture (its trial numbers give the first workers distinct grid points); each trial scores
its architecture's every draft length once and records the best of them. When the grid is done every
worker evaluates the whole space from the shared rows (no scoring left), so each one returns the
front a single worker would.

Workers sharing a study do not propose one another's subnets: each samples with its own seed
(`worker_seed`: the study, ``--seed`` and the worker's ordinal in the study), TPE's constant
liar counts the subnets being scored elsewhere as bad, and `DistinctSampler` steers a proposal
the study already holds to an unevaluated subnet. The study records the inputs its figures
were computed from (user attribute ``key``); a study of other inputs is refused, never mixed.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

import optuna
from dreams_nas.nas.search.candidate import FRONTS, Candidate, Pricing
from dreams_nas.nas.search.candidate import evaluate as evaluate_rows
from dreams_nas.nas.search.claims import (
    ClaimLedger,
    LocalClaims,
    _pid_alive,
    host_identity,
    retry_dead_trial,
    wait_for_creator,
)
from dreams_nas.nas.search.config import SearchConfig
from dreams_nas.nas.search.params import arch_params, params_of, search_distributions, spec_of
from dreams_nas.nas.search.sampler import DistinctSampler, suggest, worker_seed
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.shared import SharedRows, acceptance_scope, arch_key
from dreams_nas.nas.search.storage import claims_url, open_storage, storage_errors
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from optuna.trial import FrozenTrial, TrialState

MAX_CONSECUTIVE_DUPLICATES = 200  # the sampler has converged: stop instead of spinning


class StudyRunner:
    """One worker's view of one study."""

    def __init__(self, space: SearchSpace, acceptance: CachedAcceptance, pricing: Pricing,
                 config: SearchConfig, key: Mapping[str, Any] | None = None) -> None:
        assert config.study_name is not None  # `strategies.search` names it
        self.space = space
        self.acceptance = acceptance
        self.pricing = pricing
        self.method, self.front, self.objective = config.method, config.front, config.objective
        self.max_draft_ms = config.max_draft_ms
        self.study_name, self.seed = config.study_name, config.seed
        self.show_progress = config.show_progress
        storage, study_name, wait_s = config.storage, config.study_name, config.wait_s
        self.host, self.pid = host_identity(), os.getpid()
        self.distributions = search_distributions(space)
        # JSON round trip: the key compares equal to the copy the storage gives back
        self.key = None if key is None else json.loads(json.dumps(dict(key), default=str))
        self.storage = open_storage(storage)
        with storage_errors(storage):
            self.ledger: ClaimLedger | LocalClaims = (
                LocalClaims() if storage is None else ClaimLedger(claims_url(storage), study_name)
            )
            self.ordinal = self.ledger.join()
            if storage is not None:
                self._share_acceptance(claims_url(storage), wait_s)
        self.worker_seed = worker_seed(study_name, self.seed, self.ordinal)
        self._reserved: set[str] = set()  # claimed by the sampler, not yet scored
        self.study, self.created = self._open_study()
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self._fail_dead_local_trials()
        self._adopt_completed_claims()

    def _share_acceptance(self, url: str, wait_s: float) -> None:
        """Score tau through the storage's shared rows, one claim per architecture."""
        self.acceptance.use_space(self.space)
        scope = acceptance_scope(self.acceptance.table, self.acceptance.scorer)
        shared = SharedRows(url, scope, self.ledger.worker)
        self.acceptance.share(shared, ClaimLedger(url, shared.claims_name), wait_s=wait_s)

    def close(self) -> None:
        self.ledger.close()
        self.acceptance.unshare()

    # --- the study ------------------------------------------------------------------
    def _sampler(self) -> optuna.samplers.BaseSampler:
        if self.method == "exhaustive":
            grid = {name: list(getattr(self.space, name)) for name in arch_params(self.space)}
            return optuna.samplers.GridSampler(grid, seed=self.worker_seed)
        # Feasibility reaches TPE through each trial's constraints (Trial.set_constraint).
        # TPE is multi-objective too (pareto); the constant liar scores the subnets other
        # workers are evaluating as bad, so this one looks elsewhere.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            tpe = optuna.samplers.TPESampler(seed=self.worker_seed, multivariate=True,
                                             constant_liar=True)
        # first the subnets a killed worker was scoring, then the extremes
        by_id = {spec.id: spec for spec in self.space.enumerate()}
        orphans = [by_id[sid] for sid in self.ledger.orphans() if sid in by_id]
        first = [params_of(s, self.distributions)
                 for s in (*orphans, self.space.largest(), self.space.smallest())]
        return DistinctSampler(tpe, self.distributions, self.worker_seed, self._reserve, first)

    def _reserve(self, params: dict[str, Any]) -> bool:
        """Claim the subnet the sampler proposes: the trial then scores it without asking."""
        spec_id = spec_of(params).id
        if self.ledger.claim(spec_id):
            self._reserved.add(spec_id)
            return True
        return False

    def _constraints(self, cand: Candidate) -> dict[str, float]:
        """Optuna's convention: <= 0 is feasible; here the draft step within the limit."""
        if self.max_draft_ms is None:
            return {}
        return {"draft_ms": cand.draft_ms - float(self.max_draft_ms)}

    def _open_study(self) -> tuple[optuna.Study, bool]:
        directions = ["maximize"] if self.objective == "speedup" else ["maximize", "minimize"]
        try:
            study = optuna.create_study(storage=self.storage, study_name=self.study_name,
                                        directions=directions, sampler=self._sampler())
            created = True
            study.set_user_attr("space", self.space.to_dict())
            study.set_user_attr("objective", self.objective)
            study.set_user_attr("method", self.method)
            if self.objective == "pareto":
                study.set_user_attr("front", self.front)
            study.set_user_attr("max_draft_ms", self.max_draft_ms)
            if self.key is not None:
                study.set_user_attr("key", self.key)
            names = list(FRONTS[self.front]) if self.objective == "pareto" else ["speedup"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(names)
        except optuna.exceptions.DuplicatedStudyError:
            self._check_distributions()
            study = optuna.load_study(study_name=self.study_name, storage=self.storage,
                                      sampler=self._sampler())
            created = False
            wait_for_creator(study)
            want = [optuna.study.StudyDirection.MAXIMIZE] * 1 + (
                [optuna.study.StudyDirection.MINIMIZE] if self.objective == "pareto" else [])
            if list(study.directions) != want:
                raise InputError(
                    f"study {self.study_name!r} optimises {len(study.directions)} objective(s), "
                    f"not the {len(want)} of --objective {self.objective}; use another study "
                    "name or storage"
                ) from None
            method = study.user_attrs.get("method")
            if method != self.method:
                raise InputError(
                    f"study {self.study_name!r} in the storage was made by --method {method}, "
                    f"not --method {self.method}; use another --study-name"
                ) from None
            front = study.user_attrs.get("front")
            if self.objective == "pareto" and front != self.front:
                raise InputError(
                    f"study {self.study_name!r} in the storage optimises the {front} front, not "
                    f"--front {self.front}; use another --study-name"
                ) from None
            stored = study.user_attrs.get("space")
            if stored is not None and stored != self.space.to_dict():
                raise InputError(
                    f"study {self.study_name!r} in the storage searched another space {stored}; "
                    "use a new --storage (or delete the study) to search this space"
                ) from None
            self._check_key(study.user_attrs.get("key"))
        return study, created

    def _check_distributions(self) -> None:
        """Refuse a study whose trials were sampled from other parameter distributions (another
        dreams-nas version's): its trials could not be continued."""
        study_id = self.storage.get_study_id_from_name(self.study_name)
        for t in self.storage.get_all_trials(study_id, deepcopy=False):
            other = sorted(n for n, d in t.distributions.items()
                           if n in self.distributions and d != self.distributions[n])
            if other:
                raise InputError(
                    f"study {self.study_name!r} in the storage sampled {', '.join(other)} from "
                    "other distributions (another dreams-nas version): use another "
                    "--study-name or storage")
            if t.distributions:
                return

    def _check_key(self, stored: Any) -> None:
        """Refuse a study whose figures came from other inputs (another latency predictor,
        context length, dtype...): its speedups are not this search's."""
        if self.key is None or stored == self.key:
            return
        if not isinstance(stored, dict):
            raise InputError(
                f"study {self.study_name!r} in the storage records no inputs (another "
                "dreams-nas version, or a study made without a key): its speedups cannot be "
                "checked; omit --study-name or give a new one")
        changed = sorted(k for k in set(stored) | set(self.key) if stored.get(k) != self.key.get(k))
        diff = ", ".join(f"{k}: {stored.get(k)!r} -> {self.key.get(k)!r}" for k in changed[:4])
        raise InputError(
            f"study {self.study_name!r} in the storage was computed from other inputs ({diff}); "
            "omit --study-name (the default name follows the inputs) or give a new one"
        )

    def _fail_dead_local_trials(self) -> None:
        """A SIGKILLed run leaves RUNNING trials; fail those whose process on this host is gone."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            host, pid = t.user_attrs.get("host"), t.user_attrs.get("pid")
            if host == self.host and isinstance(pid, int) and not _pid_alive(pid):
                tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, t.number)
                self.storage.set_trial_state_values(tid, TrialState.FAIL)
                if "grid_id" in t.system_attrs:  # the grid counts a failed point as visited
                    retry_dead_trial(self.study, self.storage.get_trial(tid))

    def _adopt_completed_claims(self) -> None:
        """A worker killed after Optuna stored its trial COMPLETE but before the claim was
        marked done leaves a running claim for a scored subnet: the sampler (which skips the
        study's subnets) would never retry it, and it would not count towards the budget."""
        claims = self.ledger.all()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            spec_id = t.user_attrs.get("spec_id")
            claim = claims.get(spec_id) if spec_id is not None else None
            if claim is not None and claim.state == "running" and "duplicate_of" not in \
                    t.user_attrs and "tau" in t.user_attrs:
                self.ledger.adopt_done(spec_id, t.number)

    def _values(self, cand: Candidate) -> list[float]:
        if self.objective == "speedup":
            return [cand.speedup]
        high, low = FRONTS[self.front]
        return [cand.value(high), cand.value(low)]

    def _evaluate(self, spec: SubnetSpec, number: int) -> Candidate:
        rows = self.acceptance.rows([spec], show_progress=False)
        return evaluate_rows(rows, self.pricing, max_draft_ms=self.max_draft_ms,
                             numbers=[number])[0]

    def _trial(self, number: int) -> FrozenTrial:
        tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self.storage.get_trial(tid)

    def _n_done(self) -> int:
        return self.ledger.count_done()

    def candidates(self) -> list[Candidate]:
        """Every scored subnet of the study (owner trials; the first one per subnet)."""
        out: dict[str, Candidate] = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            a = t.user_attrs
            if "duplicate_of" in a or "spec_id" not in a or a["spec_id"] in out:
                continue
            spec = spec_of(t.params)
            out[a["spec_id"]] = Candidate.from_attrs(spec, a, t.number)
        return sorted(out.values(), key=lambda c: c.number)

    # --- strategy: Optuna -----------------------------------------------------------
    def optimize(self, budget: int, *, wait_s: float) -> list[Candidate]:
        """Run trials until `budget` distinct subnets of the study are scored."""
        done = self._n_done()
        bar = progress(total=budget, desc=f"optuna ({self.objective})", unit="subnet",
                       disable=None if self.show_progress is None else not self.show_progress)
        bar.update(min(done, budget))
        duplicates = 0

        def objective(trial: optuna.Trial) -> list[float]:
            trial.set_user_attr("host", self.host)
            trial.set_user_attr("pid", self.pid)
            params = {n: suggest(trial, n, d) for n, d in self.distributions.items()}
            spec = spec_of(params)
            trial.set_user_attr("spec_id", spec.id)
            cand, owner_number = self._claim_or_copy(spec, trial.number)
            attrs = cand.to_attrs()
            if owner_number is not None:
                attrs["duplicate_of"] = owner_number
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            for key, value in self._constraints(cand).items():
                trial.set_constraint(key, value)
            return self._values(cand)

        def after(study: optuna.Study, trial: FrozenTrial) -> None:
            nonlocal done, duplicates
            if trial.state == TrialState.COMPLETE and "duplicate_of" not in trial.user_attrs:
                self.ledger.done(trial.user_attrs["spec_id"], trial.number)
                duplicates = 0
            else:
                duplicates += 1
            now = self._n_done()
            bar.update(max(0, min(now, budget) - min(done, budget)))
            done = now
            if done >= budget or done >= self.space.size or duplicates > MAX_CONSECUTIVE_DUPLICATES:
                study.stop()

        try:
            if done < budget:
                self.study.optimize(objective, callbacks=[after],
                                    n_trials=budget * 20 + 100, gc_after_trial=False)
            self.ledger.wait_until_done(timeout_s=wait_s)
        finally:
            bar.close()
            for spec_id in self._reserved:  # proposed but never scored (an interrupted trial)
                self.ledger.release(spec_id)
            self._reserved.clear()
        return self.candidates()

    def _claim_or_copy(self, spec: SubnetSpec, number: int) -> tuple[Candidate, int | None]:
        """Evaluate `spec` as its owner if this worker holds or wins its claim; otherwise as a
        copy of the owner's figures (the owner's trial number, or -1 while it is running: tau
        comes from the shared rows all the same, nothing is scored twice)."""
        mine = spec.id in self._reserved
        self._reserved.discard(spec.id)
        if mine or self.ledger.claim(spec.id):
            try:
                with self.ledger.keepalive():
                    return self._evaluate(spec, number), None
            except BaseException:
                self.ledger.release(spec.id)
                raise
        claim = self.ledger.get(spec.id)
        if claim is not None and claim.state == "done" and claim.trial_number is not None:
            owner = self._trial(claim.trial_number)
            if "tau" in owner.user_attrs:
                return Candidate.from_attrs(spec, owner.user_attrs, number), claim.trial_number
        return self._evaluate(spec, number), -1

    # --- strategy: distributed exhaustive ---------------------------------------------
    def sweep(self, *, wait_s: float) -> list[Candidate]:
        """Score every architecture of the space once across the workers (a grid of trials),
        then evaluate the whole space from the shared rows."""
        names = arch_params(self.space)
        n_grid = self.space.n_architectures
        bar = progress(total=n_grid, desc="exhaustive (shared)", unit="architecture",
                       disable=None if self.show_progress is None else not self.show_progress)
        bar.update(min(n_grid, self._grid_done()))

        def objective(trial: optuna.Trial) -> list[float]:
            trial.set_user_attr("host", self.host)
            trial.set_user_attr("pid", self.pid)
            arch = {n: trial.suggest_categorical(n, list(getattr(self.space, n)))
                    for n in names}
            specs = [SubnetSpec(**arch, draft_len=g, tree=tree)
                     for g, tree in self.space.shapes]
            trial.set_user_attr("triple", arch_key(specs[0]))
            rows = self.acceptance.rows(specs, show_progress=False)
            cands = evaluate_rows(rows, self.pricing, max_draft_ms=self.max_draft_ms)
            best = min(cands, key=lambda c: (not c.feasible, -c.speedup, c.draft_params))
            for key, value in best.to_attrs().items():
                trial.set_user_attr(key, value)
            for key, value in self._constraints(best).items():
                trial.set_constraint(key, value)
            return self._values(best)

        def after(study: optuna.Study, trial: FrozenTrial) -> None:
            if trial.state == TrialState.COMPLETE:
                bar.update(1)

        try:
            if self._grid_done() < n_grid:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # a re-evaluated grid point
                    self.study.optimize(objective, callbacks=[after], gc_after_trial=False,
                                        n_trials=2 * n_grid + 10)
        finally:
            bar.close()
        # every architecture's rows: those scored elsewhere are read (or waited for), and one
        # whose trial died unretried is scored here
        specs = list(self.space.enumerate())
        rows = self.acceptance.rows(specs, show_progress=self.show_progress)
        return evaluate_rows(rows, self.pricing, max_draft_ms=self.max_draft_ms)

    def _grid_done(self) -> int:
        """Grid points (architectures) with a COMPLETE trial. (Like `GridSampler` itself, this
        reads every trial: fine for the thousands of architectures a space has, each scored for
        seconds.)"""
        return len({t.system_attrs.get("grid_id") for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if "grid_id" in t.system_attrs})
