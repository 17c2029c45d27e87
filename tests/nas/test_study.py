"""The Optuna study: workers that do not duplicate each other, keys that follow the inputs,
the file journal as a server-less shared storage."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
from _support.search import SMALL_SPACE, FakeLatency, FakeScorer, fake_params, run_search
from dreams_nas.nas.search.sampler import key_digest, worker_seed
from dreams_nas.supernet.core.errors import InputError


class SlowScorer(FakeScorer):
    """Scores like FakeScorer, slowly enough that parallel workers overlap."""

    def score(self, specs):
        time.sleep(0.01)
        return super().score(specs)


class SlowerLatency(FakeLatency):
    """Another latency profile: every draft step 1 ms slower (a re-profiled machine)."""

    def step_ms(self, kind, spec, context_len, k):
        extra = 1.0 if kind in ("draft", "draft_first") else 0.0
        return super().step_ms(kind, spec, context_len, k) + extra


def _search(storage, *, latency=None, **kwargs):
    kwargs.setdefault("method", "optuna")
    return run_search(SMALL_SPACE, kwargs.pop("scorer", FakeScorer()), latency or FakeLatency(),
                  fake_params, context_len=32, storage=storage, show_progress=False,
                  wait_s=60, **kwargs)


def _parallel(storage: str, n_workers: int, **kwargs) -> list:
    results, errors = [None] * n_workers, []

    def work(i: int) -> None:
        try:
            results[i] = _search(storage, scorer=SlowScorer(), **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, "\n".join(str(e) for e in errors)
    return results


def _duplicates(storage, study_name: str) -> tuple[int, int]:
    """(trials that proposed an already-held subnet, trials) of the study."""
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))
    return sum("duplicate_of" in t.user_attrs for t in trials), len(trials)


@pytest.mark.parametrize(("kind", "objective"), [
    ("journal", "speedup"),
    pytest.param("sqlite", "pareto", marks=pytest.mark.slow),  # SQLite's lock waits: ~15 s
])
def test_parallel_workers_rarely_propose_the_same_subnet(tmp_path, kind, objective) -> None:
    """4 workers, 40 subnets of 48: before per-worker seeds, the constant liar and reserved
    proposals, about 60% of their trials proposed a subnet already held."""
    storage = (f"journal:{tmp_path / 'study.log'}" if kind == "journal"
               else f"sqlite:///{tmp_path / 'study.db'}")
    results = _parallel(storage, 4, n_trials=40, seed=0, study_name="w", objective=objective)
    dup, total = _duplicates(_optuna(storage), "w")
    assert total >= 40
    assert dup <= 0.05 * total, (dup, total)
    assert all(r.n_evaluations >= 40 for r in results)
    assert len({r.best.spec for r in results}) == 1


def _optuna(storage: str):
    """An Optuna storage object for a test to read `storage` with."""
    from dreams_nas.nas.search.storage import open_storage

    return open_storage(storage)


def test_workers_of_one_study_get_their_own_seeds_and_a_lone_worker_repeats(tmp_path) -> None:
    assert worker_seed("s", 0, 0) != worker_seed("s", 0, 1)
    assert worker_seed("s", 0, 0) != worker_seed("t", 0, 0) != worker_seed("s", 1, 0)
    a = _search(f"sqlite:///{tmp_path / 'a.db'}", n_trials=12, seed=5)
    b = _search(f"sqlite:///{tmp_path / 'b.db'}", n_trials=12, seed=5)
    assert [c.spec for c in a.candidates] == [c.spec for c in b.candidates]


def test_a_lone_worker_never_proposes_a_subnet_twice() -> None:
    scorer = FakeScorer()
    result = _search(None, scorer=scorer, n_trials=SMALL_SPACE.size, seed=1)
    assert len(result.candidates) == SMALL_SPACE.size  # converged TPE still covers the space
    assert len(scorer.calls) == SMALL_SPACE.size


def test_journal_storage_resumes_and_keeps_its_claims_beside_it(tmp_path) -> None:
    journal = tmp_path / "study.journal"  # a bare path ending .journal is a journal too
    first_scorer, again_scorer = FakeScorer(), FakeScorer()
    first = _search(str(journal), n_trials=5, study_name="j", scorer=first_scorer)
    again = _search(f"journal:{journal}", n_trials=7, study_name="j", scorer=again_scorer)
    assert journal.is_file() and (tmp_path / "study.journal.claims.db").is_file()
    assert len(again.candidates) == 7
    assert not set(again_scorer.calls) & set(first_scorer.calls)  # shared rows beside it
    assert {s.replace(draft_len=1) for s in again_scorer.calls} == {
        c.spec.replace(draft_len=1) for c in again.candidates[5:]} - {
        s.replace(draft_len=1) for s in first_scorer.calls}
    assert [c.spec for c in again.candidates[:5]] == [c.spec for c in first.candidates]


def test_a_study_of_other_inputs_is_refused_by_name(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    old = {"predictor_created": "2025-01-01T00:00:00Z", "context_len": 32}
    new = {**old, "predictor_created": "2025-02-01T00:00:00Z"}
    _search(url, n_trials=4, study_name="fixed", study_key=old)
    _search(url, n_trials=4, study_name="fixed", study_key=old)  # same inputs: continues
    with pytest.raises(InputError, match=r"study 'fixed' in the storage was computed from other "
                       r"inputs \(predictor_created: '2025-01-01T00:00:00Z' -> "
                       r"'2025-02-01T00:00:00Z'\); omit --study-name"):
        _search(url, n_trials=4, study_name="fixed", study_key=new)


def test_new_inputs_make_a_new_study_whose_speedups_are_recomputed(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    old = {"predictor_created": "2025-01-01T00:00:00Z"}
    new = {"predictor_created": "2025-02-01T00:00:00Z"}
    first = _search(url, n_trials=6, study_key=old)
    second = _search(url, n_trials=6, study_key=new, latency=SlowerLatency())
    assert first.study_name.endswith(key_digest(old))
    assert second.study_name != first.study_name
    fresh = {c.spec: c.speedup for c in _search(None, n_trials=6,
                                                 latency=SlowerLatency()).candidates}
    stored = {c.spec: c.speedup for c in first.candidates}
    for c in second.candidates:
        assert c.speedup < stored.get(c.spec, float("inf"))
        assert c.spec not in fresh or c.speedup == pytest.approx(fresh[c.spec])


def test_a_finished_sweep_reruns_without_new_trials_or_scoring(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first_scorer, again_scorer = FakeScorer(), FakeScorer()
    first = _search(url, method="exhaustive", objective="pareto", scorer=first_scorer)
    n_triples = SMALL_SPACE.size // len(SMALL_SPACE.draft_len)
    assert len(first_scorer.calls) == SMALL_SPACE.size  # every triple, once
    again = _search(url, method="exhaustive", objective="pareto", scorer=again_scorer)
    assert again_scorer.calls == []
    assert [c.spec for c in again.front] == [c.spec for c in first.front]
    study = optuna.load_study(study_name=first.study_name, storage=url)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == n_triples  # one trial per triple, none added by the rerun
    assert {t.user_attrs["triple"] for t in trials} == {
        f"triple:{s.id}" for s in SMALL_SPACE.enumerate() if s.draft_len == 1}
    assert study.user_attrs["method"] == "exhaustive"
    with pytest.raises(InputError, match=r"was made by --method exhaustive, not --method optuna"):
        _search(url, method="optuna", objective="pareto", study_name=first.study_name,
                n_trials=4)


def test_ordinal_fields_are_sampled_as_integers_and_other_studies_are_refused(tmp_path,
                                                                              monkeypatch) -> None:
    from dreams_nas.nas.search import params as params_mod
    from dreams_nas.nas.search.sampler import distribution_of
    from dreams_nas.supernet.core.space import SearchSpace
    from optuna.distributions import CategoricalDistribution, IntDistribution

    assert distribution_of((1, 2, 3, 4, 5, 6, 7)) == IntDistribution(1, 7, step=1)
    assert distribution_of((16, 4, 8, 12)) == IntDistribution(4, 16, step=4)
    assert isinstance(distribution_of((1, 2, 4, 8)), CategoricalDistribution)
    assert isinstance(distribution_of((0.25, 0.5, 0.75, 1.0)), CategoricalDistribution)
    space = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                        draft_len=(1, 2, 3, 4))

    def run(n: int):
        return run_search(space, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                      method="optuna", n_trials=n, storage=url, study_name="s", seed=0,
                      show_progress=False)

    url = f"sqlite:///{tmp_path / 'new.db'}"
    run(6)
    trial = optuna.load_study(study_name="s", storage=url).trials[0]
    assert trial.distributions["draft_len"] == IntDistribution(1, 4, step=1)
    assert isinstance(trial.params["draft_len"], int)
    # a study sampled from other distributions (every field categorical) is refused in one
    # line, not continued with the wrong parameter space
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with monkeypatch.context() as m:
        m.setattr(params_mod, "distribution_of", lambda values: CategoricalDistribution(
            list(values)))
        run(5)
    with pytest.raises(InputError, match=r"study 's' in the storage sampled draft_len from "
                                         r"other distributions .*use another --study-name or "
                                         "storage"):
        run(9)


def test_a_subnet_stored_complete_whose_claim_stayed_running_counts_once(tmp_path) -> None:
    """The SIGKILL window between Optuna storing a trial COMPLETE and the claim's update: the
    rerun adopts the claim, so the subnet counts towards the budget (before, the sampler
    skipped it as held and the budget was met with one subnet too many)."""
    import subprocess
    import sys

    import sqlalchemy as sa
    from dreams_nas.nas.search.claims import ClaimLedger, _claims
    from dreams_nas.nas.search.storage import claims_url

    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = _search(url, study_name="window", objective="speedup", n_trials=4)
    assert first.n_evaluations == 4
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    victim = first.candidates[-1].spec.id
    engine = sa.create_engine(claims_url(url))
    with engine.begin() as conn:
        hit = conn.execute(sa.update(_claims).where(_claims.c.spec_id == victim).values(
            state="running", pid=dead.pid, trial_number=None)).rowcount
    engine.dispose()
    assert hit == 1
    again = _search(url, study_name="window", objective="speedup", n_trials=6)
    assert again.n_evaluations == 6  # the adopted subnet among the first 4, then 2 new
    ledger = ClaimLedger(claims_url(url), "window")
    try:
        claim = ledger.get(victim)
        assert claim is not None and claim.state == "done"
        assert claim.trial_number == first.candidates[-1].number
        assert ledger.count_done() == 6
    finally:
        ledger.close()
