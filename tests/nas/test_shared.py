"""Acceptance rows shared through the storage: a triple is scored once, by one worker."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from _support.search import SMALL_SPACE, FakeScorer
from dreams_nas.nas.search.claims import ClaimLedger
from dreams_nas.nas.search.scoring import CachedAcceptance
from dreams_nas.nas.search.shared import TABLE, SharedRows, acceptance_scope, arch_key
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec

SPEC = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=3)


class SlowScorer(FakeScorer):
    def score(self, specs):
        time.sleep(0.3)
        return super().score(specs)


def _worker(url: str, scorer: FakeScorer, name: str) -> CachedAcceptance:
    cached = CachedAcceptance(scorer, draft_lens=SMALL_SPACE.draft_len)
    shared = SharedRows(url, acceptance_scope(scorer), name)
    cached.share(shared, ClaimLedger(url, shared.claims_name), wait_s=30)
    return cached


def test_two_workers_asking_for_one_triple_score_it_once(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    scorers = [SlowScorer(), SlowScorer()]
    workers = [_worker(url, s, f"w{i}") for i, s in enumerate(scorers)]
    got: dict[int, list] = {}

    def ask(i: int, spec: SubnetSpec) -> None:
        got[i] = workers[i].rows([spec], show_progress=False)

    threads = [threading.Thread(target=ask, args=(0, SPEC)),
               threading.Thread(target=ask, args=(1, SPEC.replace(draft_len=5)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    calls = scorers[0].calls + scorers[1].calls
    assert sorted(s.draft_len for s in calls) == list(SMALL_SPACE.draft_len)  # one triple, once
    assert got[0][0].spec == SPEC and got[1][0].spec == SPEC.replace(draft_len=5)
    owner = workers[0]._shared.scorers()[arch_key(SPEC)]
    assert len(owner) == 1
    for w in workers:
        w.unshare()


def test_a_dead_workers_triple_is_taken_over(tmp_path) -> None:
    import socket
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    scorer = FakeScorer()
    worker = _worker(url, scorer, "alive")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger = worker._ledger
    assert ledger.claim(arch_key(SPEC))  # as a worker that then died mid-scoring
    with ledger._engine.begin() as conn:
        from dreams_nas.nas.search.claims import _claims

        conn.execute(sa.update(_claims).values(worker="gone", pid=dead.pid,
                                               host=ledger.host))
    rows = worker.rows([SPEC], show_progress=False)
    assert rows[0].spec == SPEC and len(scorer.calls) == len(SMALL_SPACE.draft_len)
    assert socket.gethostname() in ledger.host
    worker.unshare()


def test_other_inputs_do_not_share_rows(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    fp32, bf16 = FakeScorer(), FakeScorer(dtype="bfloat16")
    a, b = _worker(url, fp32, "a"), _worker(url, bf16, "b")
    a.rows([SPEC], show_progress=False)
    b.rows([SPEC], show_progress=False)
    assert len(fp32.calls) == len(bf16.calls) == len(SMALL_SPACE.draft_len)
    assert b.rows([SPEC], show_progress=False)[0].dtype == "bfloat16"
    a.unshare()
    b.unshare()


def test_a_damaged_shared_row_is_refused_in_one_line(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = _worker(url, FakeScorer(), "a")
    a.rows([SPEC], show_progress=False)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {TABLE} SET row = '{{\"tau\": \"x\"}}' WHERE seq = 1"))
    engine.dispose()
    with pytest.raises(InputError, match=r"the shared acceptance row of .* is damaged"):
        _worker(url, FakeScorer(), "b")
    a.unshare()


def test_rows_scored_elsewhere_reach_the_runs_csv(tmp_path) -> None:
    from dreams_nas.supernet.acceptance.table import AcceptanceTable

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a = _worker(url, FakeScorer(), "a")
    a.rows([SPEC], show_progress=False)
    scorer = FakeScorer()
    table = AcceptanceTable(tmp_path / "b.csv", scorer.supernet_hash, scorer.dataset_id,
                            dtype=scorer.dtype, max_new_tokens=scorer.max_new_tokens)
    b = CachedAcceptance(scorer, table, draft_lens=SMALL_SPACE.draft_len)
    shared = SharedRows(url, acceptance_scope(table, scorer), "b")
    b.share(shared, ClaimLedger(url, shared.claims_name))
    assert b.rows([SPEC], show_progress=False)[0].spec == SPEC and scorer.calls == []
    assert b.sync_table() == len(SMALL_SPACE.draft_len)
    assert b.sync_table() == 0  # once
    assert set(table.load()) == {SPEC.replace(draft_len=g) for g in SMALL_SPACE.draft_len}
    a.unshare()
    b.unshare()
