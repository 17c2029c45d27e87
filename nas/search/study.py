"""The study-backed strategies: Optuna TPE search and the distributed exhaustive sweep.

Every evaluated subnet is one COMPLETE trial carrying its figures in user attributes, so any
worker (or `optuna-dashboard`) reads the same results. A subnet is scored only by the worker
that won its claim (`claims.py`); a trial that samples an already-scored subnet copies its
values (user attribute ``duplicate_of``) instead of scoring it again.

Workers sharing a study do not propose one another's subnets: each samples with its own seed
(`worker_seed`: the study, ``--seed`` and the worker's ordinal in the study), TPE's constant
liar counts the subnets being scored elsewhere as bad, and `DistinctSampler` steers a proposal
the study already holds to an unevaluated subnet. The study records the inputs its figures
were computed from (user attribute ``key``); a study of other inputs is refused, never mixed.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from dreams_nas.nas.search.candidate import Candidate, DraftParams, LatencyCache
from dreams_nas.nas.search.candidate import evaluate as evaluate_rows
from dreams_nas.nas.search.claims import ClaimLedger, LocalClaims, _pid_alive
from dreams_nas.nas.search.sampler import DistinctSampler, worker_seed
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.storage import claims_url, open_storage, storage_errors
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.space import SPEC_FIELDS, SearchSpace, SubnetSpec
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

MAX_CONSECUTIVE_DUPLICATES = 200  # the sampler has converged: stop instead of spinning


class StudyRunner:
    """One worker's view of one study."""

    def __init__(self, space: SearchSpace, acceptance: CachedAcceptance, latency: LatencyCache,
                 draft_params: DraftParams, *, objective: str, max_draft_ms: float | None,
                 storage: str | None, study_name: str, seed: int,
                 show_progress: bool | None, key: Mapping[str, Any] | None = None) -> None:
        self.space = space
        self.acceptance = acceptance
        self.latency = latency
        self.draft_params = draft_params
        self.objective = objective
        self.max_draft_ms = max_draft_ms
        self.study_name = study_name
        self.seed = seed
        self.show_progress = show_progress
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.distributions = {
            name: CategoricalDistribution(list(getattr(space, name))) for name in SPEC_FIELDS
        }
        # JSON round trip: the key compares equal to the copy the storage gives back
        self.key = None if key is None else json.loads(json.dumps(dict(key), default=str))
        self.storage = open_storage(storage)
        with storage_errors(storage):
            self.ledger: ClaimLedger | LocalClaims = (
                LocalClaims() if storage is None else ClaimLedger(claims_url(storage), study_name)
            )
            self.ordinal = self.ledger.join()
        self.worker_seed = worker_seed(study_name, seed, self.ordinal)
        self._reserved: set[str] = set()  # claimed by the sampler, not yet scored
        self.study, self.created = self._open_study()
        self.study_id = self.storage.get_study_id_from_name(study_name)
        self._fail_dead_local_trials()

    def close(self) -> None:
        self.ledger.close()

    # --- the study ------------------------------------------------------------------
    def _sampler(self) -> optuna.samplers.BaseSampler:
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
        first = [s.to_fields() for s in (*orphans, self.space.largest(), self.space.smallest())]
        return DistinctSampler(tpe, self.distributions, self.worker_seed, self._reserve, first)

    def _reserve(self, params: dict[str, Any]) -> bool:
        """Claim the subnet the sampler proposes: the trial then scores it without asking."""
        spec_id = SubnetSpec(**params).id
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
            study.set_user_attr("max_draft_ms", self.max_draft_ms)
            if self.key is not None:
                study.set_user_attr("key", self.key)
            names = ["speedup", "draft_params"] if self.objective == "pareto" else ["speedup"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(names)
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=self.study_name, storage=self.storage,
                                      sampler=self._sampler())
            created = False
            want = [optuna.study.StudyDirection.MAXIMIZE] * 1 + (
                [optuna.study.StudyDirection.MINIMIZE] if self.objective == "pareto" else [])
            if list(study.directions) != want:
                raise InputError(
                    f"study {self.study_name!r} optimises {len(study.directions)} objective(s), "
                    f"not the {len(want)} of --objective {self.objective}; use another study "
                    "name or storage"
                ) from None
            stored = study.user_attrs.get("space")
            if stored is not None and stored != self.space.to_dict():
                raise InputError(
                    f"study {self.study_name!r} in the storage searched another space {stored}; "
                    "use a new --storage (or delete the study) to search this space"
                ) from None
            self._check_key(study.user_attrs.get("key"))
        return study, created

    def _check_key(self, stored: Any) -> None:
        """Refuse a study whose figures came from other inputs (another latency predictor,
        context length, dtype...): its speedups are not this search's."""
        if self.key is None or not isinstance(stored, dict) or stored == self.key:
            return
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

    def _values(self, cand: Candidate) -> list[float]:
        if self.objective == "speedup":
            return [cand.speedup]
        return [cand.speedup, float(cand.draft_params)]

    def _evaluate(self, spec: SubnetSpec, number: int) -> Candidate:
        rows = self.acceptance.rows([spec], show_progress=False)
        return evaluate_rows(rows, self.latency, self.draft_params,
                             max_draft_ms=self.max_draft_ms, numbers=[number])[0]

    def _trial(self, number: int) -> FrozenTrial:
        tid = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self.storage.get_trial(tid)

    def _n_done(self) -> int:
        return sum(c.state == "done" for c in self.ledger.all().values())

    def candidates(self) -> list[Candidate]:
        """Every scored subnet of the study (owner trials; the first one per subnet)."""
        out: dict[str, Candidate] = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            a = t.user_attrs
            if "duplicate_of" in a or "spec_id" not in a or a["spec_id"] in out:
                continue
            spec = SubnetSpec(**{n: t.params[n] for n in SPEC_FIELDS})
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
            params = {n: trial.suggest_categorical(n, list(getattr(self.space, n)))
                      for n in SPEC_FIELDS}
            spec = SubnetSpec(**params)
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
        """Score `spec` if this worker wins its claim; otherwise the owner's figures."""
        while True:
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
            if claim is None:
                continue
            if claim.state == "done" and claim.trial_number is not None:
                owner = self._trial(claim.trial_number)
                return Candidate.from_attrs(spec, owner.user_attrs, number), claim.trial_number
            time.sleep(0.2)  # another worker is scoring it right now

    # --- strategy: distributed exhaustive ---------------------------------------------
    def sweep(self, *, wait_s: float) -> list[Candidate]:
        """Claim and score subnets until every one of the space is scored by some worker."""
        rng = np.random.default_rng(self.worker_seed)
        specs = list(self.space.enumerate())
        bar = progress(total=len(specs), desc="exhaustive (shared)", unit="subnet",
                       disable=None if self.show_progress is None else not self.show_progress)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                claims = self.ledger.all()
                todo = [specs[i] for i in rng.permutation(len(specs))
                        if claims.get(specs[i].id) is None
                        or claims[specs[i].id].state != "done"]
                bar.n = len(specs) - len(todo)
                bar.refresh()
                if not todo or time.monotonic() > deadline:
                    break
                progressed = False
                for spec in todo:
                    if not self.ledger.claim(spec.id):
                        continue
                    progressed = True
                    try:
                        with self.ledger.keepalive():
                            self._record(spec)
                    except BaseException:
                        self.ledger.release(spec.id)
                        raise
                    bar.update(1)
                if not progressed:  # the rest is being scored elsewhere: wait for it
                    self.ledger.wait_until_done(timeout_s=max(0.0, deadline - time.monotonic()))
        finally:
            bar.close()
        return self.candidates()

    def _record(self, spec: SubnetSpec) -> None:
        cand = self._evaluate(spec, -1)
        frozen = optuna.trial.create_trial(
            params=spec.to_fields(), distributions=self.distributions,
            values=self._values(cand),
            user_attrs={**cand.to_attrs(), "host": self.host, "pid": self.pid},
            constraints=self._constraints(cand) or None,
        )
        tid = self.storage.create_new_trial(self.study_id, template_trial=frozen)
        self.ledger.done(spec.id, self.storage.get_trial_number_from_id(tid))

