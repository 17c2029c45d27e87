"""Several search workers on one shared study: PostgreSQL (real server) and SQLite + SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from _support.postgres import PostgresServer, unavailable_reason
from _support.search import SMALL_SPACE, FakeLatency, FakeScorer, fake_params, run_search
from _support.search_worker import hung_marker

TESTS = Path(__file__).resolve().parents[1]  # holds the package `_support`
pytestmark = pytest.mark.slow  # worker processes import optuna: seconds each


@pytest.fixture(scope="module")
def postgres_url():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        url = server.start()
    except subprocess.CalledProcessError as exc:
        server.stop()
        pytest.fail(f"could not start PostgreSQL: {exc.stderr or exc.stdout}")
    yield url
    server.stop()


def _start_worker(tmp_path: Path, name: str, **cfg) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"{name}.log"
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({"log": str(log), **cfg}))
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "_support.search_worker", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": path})
    return proc, log


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _scored(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _shared_rows(url: str) -> dict[str, list[str]]:
    """triple -> the workers whose rows of it the shared acceptance table holds (one entry per
    row: a triple scored twice would show two workers, or more rows than draft lengths)."""
    import sqlalchemy as sa
    from dreams_nas.nas.search.shared import TABLE

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(sa.text(f"SELECT triple, worker FROM {TABLE}")).all()
    finally:
        engine.dispose()
    out: dict[str, list[str]] = {}
    for arch, worker in found:
        out.setdefault(arch, []).append(worker)
    return out


def _assert_each_triple_scored_once(rows: dict[str, list[str]], space) -> None:
    want = {f"triple:{s.id}" for s in space.enumerate() if s.draft_len == 1}
    assert set(rows) == want  # every triple, shared
    for arch, workers in rows.items():
        assert len(set(workers)) == 1, (arch, workers)  # by one worker
        assert len(workers) == len(space.draft_len), (arch, workers)  # each row once


def _duplicate_trials(storage: str, study_name: str) -> tuple[int, int]:
    import optuna
    from dreams_nas.nas.search.storage import open_storage

    trials = optuna.load_study(study_name=study_name, storage=open_storage(storage)).trials
    return sum("duplicate_of" in t.user_attrs for t in trials), len(trials)


def _cli_worker(run: Path, data: Path, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "dreams_nas.nas.cli", "search", "--run", str(run), "--data",
            str(data), "--limit", "4", "--max-new-tokens", "12", "--device", "cpu",
            "--threads", "1", "--verify", "0", "--no-report", "--json", "-q", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_cli_workers_on_postgres_score_each_triple_once(postgres_url, tmp_path,
                                                              tmp_path_factory, capsys) -> None:
    """4 workers of `search --method optuna` and 4 of the exhaustive sweep on the tiny target,
    each with its own copy of the run folder (as on separate hosts), one PostgreSQL database:
    every (heads, visual_keep, inject_layer) triple is scored once by one of the 8 workers, the
    Optuna workers rarely propose a held subnet, and every sweep worker returns the front of a
    single-worker exhaustive search."""
    from _support.trained import SPACE, copy_run, trained_run, write_jsonl
    from dreams_nas.nas import cli

    run, examples = trained_run(tmp_path_factory)
    data = write_jsonl(examples, tmp_path / "eval.jsonl")
    procs = []
    for i in range(4):
        procs.append(_cli_worker(copy_run(run, tmp_path / f"optuna{i}").root, data,
                                 "--storage", postgres_url, "--method", "optuna",
                                 "--trials", "12"))
        procs.append(_cli_worker(copy_run(run, tmp_path / f"sweep{i}").root, data,
                                 "--storage", postgres_url, "--method", "exhaustive"))
    results = [_finish(p) for p in procs]
    optuna_runs, sweeps = results[0::2], results[1::2]
    _assert_each_triple_scored_once(_shared_rows(postgres_url), SPACE)
    assert sum(r["n_scored"] for r in results) == SPACE.size  # each row computed once
    assert len({r["study_name"] for r in optuna_runs}) == 1
    dup, total = _duplicate_trials(postgres_url, optuna_runs[0]["study_name"])
    assert dup <= 0.05 * total, (dup, total)
    assert all(r["n_evaluations"] >= 12 for r in optuna_runs)
    single = copy_run(run, tmp_path / "single").root
    capsys.readouterr()
    code = cli.main(["search", "--run", str(single), "--data", str(data), "--limit", "4",
                     "--max-new-tokens", "12", "--device", "cpu", "--threads", "1",
                     "--verify", "0", "--no-report", "-q", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    want = json.loads(out)["front"]
    assert [r["front"] for r in sweeps] == [want] * 4
    assert all(r["n_evaluations"] == SPACE.size for r in sweeps)


def test_eight_journal_workers_score_each_triple_once(tmp_path) -> None:
    """The same with Optuna's file journal and no server (the fake scorer: the storage's
    sharing is what is tested): 4 Optuna workers, 4 sweep workers, one journal."""
    storage = f"journal:{tmp_path / 'study.log'}"
    common = {"storage": storage, "objective": "pareto", "delay_s": 0.05,
              "supernet_hash": "journal8"}
    workers = []
    for i in range(4):
        workers.append(_start_worker(tmp_path, f"tpe{i}", **common, method="optuna",
                                     n_trials=24, study_name="tpe"))
        workers.append(_start_worker(tmp_path, f"sweep{i}", **common, method="exhaustive",
                                     study_name="sweep"))
    results = [_finish(proc) for proc, _ in workers]
    logged = [s for _, log in workers for s in _scored(log)]
    assert len(logged) == len(set(logged)) == SMALL_SPACE.size  # no subnet scored twice
    _assert_each_triple_scored_once(
        _shared_rows(f"sqlite:///{tmp_path / 'study.log'}.claims.db"), SMALL_SPACE)
    dup, total = _duplicate_trials(storage, "tpe")
    assert dup <= 0.05 * total, (dup, total)
    single = run_search(SMALL_SPACE, FakeScorer(), FakeLatency(), fake_params, context_len=32,
                    objective="pareto", show_progress=False)
    want = [[c.spec.id, pytest.approx(c.speedup)] for c in single.front]
    assert [r["front"] for r in results[1::2]] == [want] * 4
    assert len({r["best"] for r in results}) == 1


def test_sigkilled_optuna_run_continues_the_same_study(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    cfg = {"method": "optuna", "storage": url, "study_name": "resume", "objective": "speedup",
           "n_trials": 12, "delay_s": 0.05, "supernet_hash": "killed"}
    # The first run stops once 8 subnets are logged, inside the trial that scored them (its
    # rows not yet stored), and is killed there: mid-trial whatever the machine's load. (Killed
    # at a moment of the test's choosing, a loaded machine could land the kill between Optuna
    # creating the next trial and the trial recording its host and pid, which leaves a trial
    # RUNNING that no restart can tell from a live worker's.)
    proc, log = _start_worker(tmp_path, "killed", **cfg, hang_after=8)
    deadline = time.monotonic() + 120
    while not hung_marker(log).is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1]
    assert hung_marker(log).is_file(), "the worker did not reach its 8th subnet in 120 s"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _scored(log)
    assert 8 <= len(before) < SMALL_SPACE.size
    rerun, log2 = _start_worker(tmp_path, "rerun", **cfg)
    result = _finish(rerun)
    after = _scored(log2)
    assert result["n"] == 12
    # nothing the killed run stored is scored again; only the triple it was scoring when the
    # kill landed (logged, its rows not yet stored) may be scored once more
    in_flight = before[-1].rsplit("-", 1)[0]
    assert all(s.rsplit("-", 1)[0] == in_flight for s in set(before) & set(after))
    import optuna

    study = optuna.load_study(study_name="resume", storage=url)
    states = Counter(t.state.name for t in study.trials)
    assert states["RUNNING"] == 0  # the killed trial was failed on restart
    owners = [t for t in study.trials
              if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs]
    subnets = {t.user_attrs["spec_id"] for t in owners}
    assert len(owners) == len(subnets) == 12  # the budget: 12 distinct subnets, each once
    assert subnets <= set(before) | set(after)  # each one's tau was scored, by one run
