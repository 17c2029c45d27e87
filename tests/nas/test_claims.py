"""Claims between workers: the database's clock, compare-and-swap takeovers, host identity."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import sqlalchemy as sa
from dreams_nas.nas.search import claims as claims_mod
from dreams_nas.nas.search.claims import ClaimLedger, host_identity


def _ledgers(tmp_path, n: int = 2, **kwargs) -> list[ClaimLedger]:
    url = f"sqlite:///{tmp_path / 'claims.db'}"
    return [ClaimLedger(url, "study", **kwargs) for _ in range(n)]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _set(ledger: ClaimLedger, spec_id: str, **values) -> None:
    with ledger._engine.begin() as conn:
        conn.execute(sa.update(claims_mod._claims).where(
            claims_mod._claims.c.spec_id == spec_id).values(**values))


def test_heartbeats_are_the_databases_clock_not_the_workers(tmp_path, monkeypatch) -> None:
    a, b = _ledgers(tmp_path)
    assert a.claim("s1")
    # b's own clock runs an hour ahead: with the client's clock a's live claim would look
    # stale (120 s without a beat); by the database's it is not
    real = time.time
    monkeypatch.setattr(claims_mod.time, "time", lambda: real() + 3600)
    assert not b.claim("s1")
    assert abs(a.get("s1").heartbeat - real()) < 60  # written by the database, not the client
    assert abs(b.now() - real()) < 60


def test_a_takeover_deletes_only_the_claim_at_the_heartbeat_it_saw(tmp_path, monkeypatch) -> None:
    a, b = _ledgers(tmp_path, stale_after_s=1.0)
    assert a.claim("s1")
    _set(a, "s1", heartbeat=b.now() - 10)  # silent for 10 s: stale
    stale_view = b.get("s1")
    _set(a, "s1", heartbeat=b.now())  # ... and a beats right after b looked
    monkeypatch.setattr(b, "get", lambda spec_id: stale_view)
    assert not b.claim("s1")  # the compare-and-delete misses: a keeps its subnet
    assert a.get("s1").worker == a.worker
    _set(a, "s1", heartbeat=b.now() - 10)  # now a really stops beating
    monkeypatch.undo()
    assert b.claim("s1") and b.get("s1").worker == b.worker


def test_a_dead_pid_counts_only_within_one_host_identity(tmp_path) -> None:
    a, b = _ledgers(tmp_path)
    dead = _dead_pid()
    for spec_id in ("same-host", "other-namespace"):
        assert a.claim(spec_id)
    _set(a, "same-host", pid=dead)  # this host, this PID namespace: the worker is gone
    # a container on the host network: same hostname, other PID namespace; its PID means
    # nothing here, so only its (fresh) heartbeat counts
    _set(a, "other-namespace", pid=dead, host=f"{socket.gethostname()}:feedbeef:4026531836")
    assert b.claim("same-host")
    assert not b.claim("other-namespace")
    assert host_identity().startswith(socket.gethostname())
    assert b.orphans() == []


def test_done_claims_are_counted_without_reading_every_row(tmp_path) -> None:
    (a,) = _ledgers(tmp_path, 1)
    for i in range(5):
        assert a.claim(f"s{i}")
    for i in range(3):
        a.done(f"s{i}", i)
    assert a.count_done() == 3
