"""One owner per subnet across search workers: atomic claims in the study's own database.

Optuna's RDB storages have no "insert if absent" for trial parameters, so two workers can
sample the same subnet at once. Before scoring, a worker INSERTs a row keyed by
(study name, spec id) into `dreams_nas_claims`, a table next to Optuna's in the same database
(SQLite or PostgreSQL/MySQL through SQLAlchemy). The primary key makes the insert atomic: the
loser gets an IntegrityError and does not score. A claim whose worker died (same host and
its pid gone, or no heartbeat for `stale_after_s`) is taken over with a compare-and-delete,
so a killed run's subnet is scored again by whoever comes next, once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

TABLE = "dreams_nas_claims"
_metadata = sa.MetaData()
_claims = sa.Table(
    TABLE,
    _metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("spec_id", sa.String(128), primary_key=True),
    sa.Column("worker", sa.String(256), nullable=False),
    sa.Column("host", sa.String(256), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # "running" | "done"
    sa.Column("trial_number", sa.Integer, nullable=True),
    sa.Column("heartbeat", sa.Float, nullable=False),  # unix time of the last sign of life
)


@dataclass(frozen=True)
class Claim:
    spec_id: str
    worker: str
    host: str
    pid: int
    state: str
    trial_number: int | None
    heartbeat: float


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ClaimLedger:
    """Claims of one study in the database at `url` (an SQLAlchemy/Optuna storage URL)."""

    def __init__(self, url: str, study_name: str, *, stale_after_s: float = 120.0) -> None:
        self.url = url
        self.study_name = study_name
        self.stale_after_s = float(stale_after_s)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.worker = f"{self.host}:{self.pid}:{id(self):x}"
        connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        for attempt in range(5):
            try:
                _metadata.create_all(self._engine, checkfirst=True)
                break
            except (sa_exc.IntegrityError, sa_exc.ProgrammingError):
                # another worker created the table between our check and our CREATE
                time.sleep(0.2 * (attempt + 1))

    def close(self) -> None:
        self._engine.dispose()

    # --- claiming -------------------------------------------------------------------
    def claim(self, spec_id: str) -> bool:
        """True if this worker now owns `spec_id` (and must score it), False otherwise."""
        if self._insert(spec_id):
            return True
        current = self.get(spec_id)
        if current is None:  # released between our insert and read: try once more
            return self._insert(spec_id)
        if current.state != "done" and current.worker != self.worker and self._stale(current):
            with self._engine.begin() as conn:
                taken = conn.execute(
                    sa.delete(_claims).where(
                        _claims.c.study_name == self.study_name,
                        _claims.c.spec_id == spec_id,
                        _claims.c.worker == current.worker,
                        _claims.c.state == "running",
                    )
                ).rowcount
            if taken == 1:
                return self._insert(spec_id)
        return False

    def _insert(self, spec_id: str) -> bool:
        try:
            with self._engine.begin() as conn:
                conn.execute(sa.insert(_claims).values(
                    study_name=self.study_name, spec_id=spec_id, worker=self.worker,
                    host=self.host, pid=self.pid, state="running", trial_number=None,
                    heartbeat=time.time(),
                ))
        except sa_exc.IntegrityError:
            return False
        return True

    def _stale(self, claim: Claim) -> bool:
        if claim.host == self.host and not _pid_alive(claim.pid):
            return True
        return time.time() - claim.heartbeat > self.stale_after_s

    def done(self, spec_id: str, trial_number: int) -> None:
        self._update(spec_id, state="done", trial_number=int(trial_number), heartbeat=time.time())

    def release(self, spec_id: str) -> None:
        """Give up an unfinished claim (the scoring failed) so another worker may retry."""
        with self._engine.begin() as conn:
            conn.execute(sa.delete(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
                _claims.c.worker == self.worker, _claims.c.state == "running",
            ))

    def _update(self, spec_id: str, **values: object) -> None:
        with self._engine.begin() as conn:
            conn.execute(sa.update(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
                _claims.c.worker == self.worker,
            ).values(**values))

    # --- reading --------------------------------------------------------------------
    def get(self, spec_id: str) -> Claim | None:
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
            )).first()
        return None if row is None else self._claim(row)

    def all(self) -> dict[str, Claim]:
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(_claims).where(_claims.c.study_name == self.study_name)
            ).all()
        return {r.spec_id: self._claim(r) for r in rows}

    @staticmethod
    def _claim(row: sa.Row) -> Claim:
        return Claim(spec_id=row.spec_id, worker=row.worker, host=row.host, pid=int(row.pid),
                     state=row.state, trial_number=row.trial_number,
                     heartbeat=float(row.heartbeat))

    def wait_until_done(self, spec_ids: set[str] | None = None, *, timeout_s: float = 600.0,
                        poll_s: float = 0.5) -> dict[str, Claim]:
        """Wait for other workers' running claims to finish (stale ones are not waited for)."""
        deadline = time.monotonic() + timeout_s
        while True:
            claims = self.all()
            pending = [c for sid, c in claims.items()
                       if c.state == "running" and (spec_ids is None or sid in spec_ids)
                       and not self._stale(c)]
            if not pending or time.monotonic() > deadline:
                return claims
            time.sleep(poll_s)

    # --- liveness -------------------------------------------------------------------
    @contextmanager
    def keepalive(self) -> Iterator[None]:
        """Refresh the heartbeat of this worker's running claims while the block runs."""
        stop = threading.Event()
        interval = max(0.5, self.stale_after_s / 4)

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    with self._engine.begin() as conn:
                        conn.execute(sa.update(_claims).where(
                            _claims.c.study_name == self.study_name,
                            _claims.c.worker == self.worker, _claims.c.state == "running",
                        ).values(heartbeat=time.time()))
                except sa_exc.SQLAlchemyError:
                    pass  # a missed beat only risks a takeover, never a wrong result

        thread = threading.Thread(target=beat, name="dreams-nas-claims-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
