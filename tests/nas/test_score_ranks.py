"""`dreams-nas score` on several ranks (`nas.stages.score`, torchrun): 2 CPU ranks in a gloo
group split the architectures and append to the acceptance CSV under its lock; the rows equal
one process's, and a rank killed mid-run leaves rows a relaunch completes without duplicates."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _support.ranks import KILLED, score_task, spawn
from _support.trained import copy_run, trained_run, write_jsonl
from dreams_nas.nas.stages.score import ScoreOptions, score_run
from dreams_nas.supernet.core.runfolder import RunFolder

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
TESTS = Path(__file__).resolve().parents[1]
# what a row measures (its key and its figures); not how long it took
COMPARED = ("spec_id", "tau", "tau_lo", "tau_hi", "n_prompts", "n_tokens", "accept_rate_1",
            "accept_rate_3", "context_len", "dtype", "max_new_tokens")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    run, examples = trained_run(tmp_path_factory)
    root = tmp_path_factory.mktemp("score-ranks")
    data = str(write_jsonl(examples, root / "eval.jsonl"))
    one = copy_run(run, root / "one")
    score_run(one, ScoreOptions(data=data, max_new_tokens=16, device="cpu", show_progress=False))
    return run, root, data, _rows(one)


def _rows(run: RunFolder) -> list[dict[str, str]]:
    paths = list(run.root.glob("acceptance/*.csv"))
    if not paths:  # a run killed before any rank wrote a row
        return []
    (path,) = paths
    with path.open(newline="") as handle:
        return [{k: row[k] for k in COMPARED} for row in csv.DictReader(handle)]


def _same_rows(run: RunFolder, reference: list[dict[str, str]]) -> None:
    rows = _rows(run)
    counts = Counter(r["spec_id"] for r in rows)
    assert max(counts.values()) == 1, "a row was scored twice"
    assert sorted(rows, key=lambda r: r["spec_id"]) == sorted(reference,
                                                              key=lambda r: r["spec_id"])


def test_two_ranks_score_the_rows_one_process_scores(setup):
    run, root, data, reference = setup
    two = copy_run(run, root / "two")
    spawn(score_task, 2, root, str(two.root), data, None)
    _same_rows(two, reference)
    summaries = [json.loads((two.root / f"score-summary-{r}.json").read_text()) for r in (0, 1)]
    assert summaries[0]["ranks"] == 2 and summaries[0]["n_specs"] == len(reference)
    assert summaries[0]["n_scored"] == len(reference)  # every row once, over both ranks


def test_a_rank_killed_while_scoring_is_completed_by_a_relaunch(setup):
    run, root, data, reference = setup
    killed = copy_run(run, root / "killed")
    from torch.multiprocessing import ProcessExitedException

    # rank 1 dies as it is about to write its first rows; rank 0's may be written or not
    with pytest.raises(ProcessExitedException) as failed:
        spawn(score_task, 2, root, str(killed.root), data, (1, "score", 0))
    assert failed.value.exit_code == KILLED
    assert len(_rows(killed)) < len(reference)
    spawn(score_task, 2, root, str(killed.root), data, None)
    _same_rows(killed, reference)


def test_torchrun_launches_score_and_rank_0_reports(setup):
    run, root, data, reference = setup
    launched = copy_run(run, root / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "dreams_nas.nas.cli", "--", "score", "--run", str(launched.root), "--data", data,
         "--max-new-tokens", "16", "--device", "cpu", "--threads", "1", "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # one summary, from rank 0
    summary = json.loads(lines[0])
    assert summary["ranks"] == 2 and summary["n_scored"] == len(reference)
    _same_rows(launched, reference)


def test_commands_that_do_not_split_refuse_torchrun(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "dreams_nas.nas.cli", "search", "--run",
                           str(tmp_path / "run")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "dreams-nas search: error: `dreams-nas search` runs in one process; launch it without "
        "torchrun")
