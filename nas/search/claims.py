"""One owner per subnet across search workers: atomic claims in the study's own database.

Optuna's RDB storages have no "insert if absent" for trial parameters, so two workers can
sample the same subnet at once. Before scoring, a worker INSERTs a row keyed by
(study name, spec id) into `dreams_nas_claims`, a table next to Optuna's in the same database
(SQLite or PostgreSQL/MySQL through SQLAlchemy). The primary key makes the insert atomic: the
loser gets an IntegrityError and does not score. A claim whose worker died (same host and
its pid gone, or no heartbeat for `stale_after_s`) is taken over with a compare-and-delete
on the heartbeat the taker saw, so a killed run's subnet is scored again by whoever comes
next, once. Heartbeats and staleness use the database's clock (`now()`), never a worker's,
and "same host" means the same hostname, boot and PID namespace (`host_identity`): a
container on the host network shares the hostname but not the PIDs.

A study kept in Optuna's file journal has no database: its claims go to an SQLite file beside
the journal (`storage.claims_url`). Each worker also takes the next ordinal of the study in
`dreams_nas_workers` when it joins, so workers sample with different seeds while a lone worker
with a given ``--seed`` stays reproducible (`study.worker_seed`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial
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
    sa.Column("heartbeat", sa.Float, nullable=False),  # database time of the last sign of life
)

WORKERS_TABLE = "dreams_nas_workers"
_workers = sa.Table(
    WORKERS_TABLE,
    _metadata,
    sa.Column("study_name", sa.String(512), primary_key=True),
    sa.Column("ordinal", sa.Integer, primary_key=True),  # 0 for the study's first worker
    sa.Column("worker", sa.String(256), nullable=False),
    sa.Column("host", sa.String(256), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("joined", sa.Float, nullable=False),  # unix time
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


def create_tables(metadata: sa.MetaData, engine: sa.Engine) -> None:
    """Create `metadata`'s tables unless they exist; workers starting together race to create
    them, and the losers find them there (SQLite says so with an OperationalError; anything
    else is a real failure)."""
    for attempt in range(5):
        try:
            metadata.create_all(engine, checkfirst=True)
            return
        except (sa_exc.IntegrityError, sa_exc.ProgrammingError,
                sa_exc.OperationalError) as exc:
            if isinstance(exc, sa_exc.OperationalError) and "already exists" not in str(exc):
                raise
            time.sleep(0.2 * (attempt + 1))


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def host_identity() -> str:
    """This process's host as claims see it: hostname, boot id and PID namespace. Two
    processes with the same identity see each other's PIDs (so a dead PID is a dead worker);
    a container sharing the host's network (and hostname) has another PID namespace."""
    boot = _read("/proc/sys/kernel/random/boot_id")[:8]
    try:
        pidns = f"{os.stat('/proc/self/ns/pid').st_ino:x}"
    except OSError:
        pidns = ""
    return ":".join(p for p in (socket.gethostname(), boot, pidns) if p)


def db_now(engine: sa.Engine) -> sa.ColumnElement[float]:
    """The database's clock in unix seconds, as an SQL expression (every worker reads one
    clock; a client's own may be off by minutes)."""
    name = engine.dialect.name
    if name == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)
    if name == "postgresql":
        return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Float)
    if name in ("mysql", "mariadb"):
        return sa.cast(sa.func.unix_timestamp(sa.func.now(6)), sa.Float)
    return sa.literal(time.time(), sa.Float)  # an unknown dialect: this client's clock


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
        self.host = host_identity()
        self.pid = os.getpid()
        self.worker = f"{self.host}:{self.pid}:{id(self):x}"
        connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        self._now = db_now(self._engine)
        create_tables(_metadata, self._engine)

    def close(self) -> None:
        self._engine.dispose()

    def join(self) -> int:
        """This worker's ordinal in the study: 0 for the first to join, then 1, 2, ...
        (atomic: the primary key refuses a second worker the same number)."""
        for _ in range(100):
            with self._engine.connect() as conn:
                taken = conn.execute(sa.select(sa.func.count()).select_from(_workers).where(
                    _workers.c.study_name == self.study_name)).scalar_one()
            try:
                with self._engine.begin() as conn:
                    conn.execute(sa.insert(_workers).values(
                        study_name=self.study_name, ordinal=int(taken), worker=self.worker,
                        host=self.host, pid=self.pid, joined=self._now))
            except sa_exc.IntegrityError:
                continue  # another worker took this number first
            return int(taken)
        raise RuntimeError(f"could not join study {self.study_name!r}: 100 workers raced")

    # --- claiming -------------------------------------------------------------------
    def claim(self, spec_id: str) -> bool:
        """True if this worker now owns `spec_id` (and must score it), False otherwise."""
        if self._insert(spec_id):
            return True
        current = self.get(spec_id)
        if current is None:  # released between our insert and read: try once more
            return self._insert(spec_id)
        if current.state != "done" and current.worker != self.worker and self._stale(current):
            # compare-and-delete: only the claim we judged stale, at the heartbeat we saw (a
            # beat since then, or another taker first, leaves it in place)
            with self._engine.begin() as conn:
                taken = conn.execute(
                    sa.delete(_claims).where(
                        _claims.c.study_name == self.study_name,
                        _claims.c.spec_id == spec_id,
                        _claims.c.worker == current.worker,
                        _claims.c.state == "running",
                        _claims.c.heartbeat == current.heartbeat,
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
                    heartbeat=self._now,
                ))
        except sa_exc.IntegrityError:
            return False
        return True

    def now(self) -> float:
        """The database's clock (unix seconds)."""
        with self._engine.connect() as conn:
            return float(conn.execute(sa.select(self._now)).scalar_one())

    def _stale(self, claim: Claim, now: float | None = None) -> bool:
        if claim.host == self.host and not _pid_alive(claim.pid):
            return True
        return (self.now() if now is None else now) - claim.heartbeat > self.stale_after_s

    def done(self, spec_id: str, trial_number: int) -> None:
        self._update(spec_id, state="done", trial_number=int(trial_number), heartbeat=self._now)

    def adopt_done(self, spec_id: str, trial_number: int) -> None:
        """Mark a running claim done for a trial the study already holds as COMPLETE (its
        worker was killed between Optuna storing the trial and the claim's update)."""
        with self._engine.begin() as conn:
            conn.execute(sa.update(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
                _claims.c.state == "running",
            ).values(state="done", trial_number=int(trial_number), heartbeat=self._now))

    def release(self, spec_id: str) -> None:
        """Give up an unfinished claim (the scoring failed) so another worker may retry."""
        with self._engine.begin() as conn:
            conn.execute(sa.delete(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
                _claims.c.worker == self.worker, _claims.c.state == "running",
            ))

    def release_done(self, spec_id: str) -> None:
        """Reopen a finished claim (what it produced is not enough): the next claim wins it."""
        with self._engine.begin() as conn:
            conn.execute(sa.delete(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.spec_id == spec_id,
                _claims.c.state == "done",
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

    def orphans(self) -> list[str]:
        """Subnets whose scoring was interrupted: running claims of dead or silent workers
        (the next worker should score them first, so a kill costs one subnet once)."""
        now = self.now()
        return sorted(sid for sid, c in self.all().items()
                      if c.state == "running" and self._stale(c, now))

    def count_done(self) -> int:
        """How many of the study's claims are done (one COUNT, not every row)."""
        with self._engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_claims).where(
                _claims.c.study_name == self.study_name, _claims.c.state == "done")
            ).scalar_one())

    def wait_until_done(self, spec_ids: set[str] | None = None, *, timeout_s: float = 600.0,
                        poll_s: float = 0.5) -> dict[str, Claim]:
        """Wait for other workers' running claims to finish (stale ones are not waited for)."""
        deadline = time.monotonic() + timeout_s
        while True:
            claims, now = self.all(), self.now()
            pending = [c for sid, c in claims.items()
                       if c.state == "running" and (spec_ids is None or sid in spec_ids)
                       and not self._stale(c, now)]
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
                        ).values(heartbeat=self._now))
                except sa_exc.SQLAlchemyError:
                    pass  # a missed beat only risks a takeover, never a wrong result

        thread = threading.Thread(target=beat, name="dreams-nas-claims-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


class LocalClaims:
    """In-process claims for an in-memory study (one worker, nothing to share)."""

    def __init__(self) -> None:
        self._claims: dict[str, Claim] = {}

    def join(self) -> int:
        return 0

    def claim(self, spec_id: str) -> bool:
        if spec_id in self._claims:
            return False
        self._claims[spec_id] = Claim(spec_id, "local", socket.gethostname(), os.getpid(),
                                      "running", None, time.time())
        return True

    def done(self, spec_id: str, trial_number: int) -> None:
        old = self._claims[spec_id]
        self._claims[spec_id] = Claim(spec_id, old.worker, old.host, old.pid, "done",
                                      int(trial_number), time.time())

    def adopt_done(self, spec_id: str, trial_number: int) -> None:
        if spec_id in self._claims and self._claims[spec_id].state == "running":
            self.done(spec_id, trial_number)

    def release(self, spec_id: str) -> None:
        self._claims.pop(spec_id, None)

    def get(self, spec_id: str) -> Claim | None:
        return self._claims.get(spec_id)

    def all(self) -> dict[str, Claim]:
        return dict(self._claims)

    def orphans(self) -> list[str]:
        return []

    def count_done(self) -> int:
        return sum(c.state == "done" for c in self._claims.values())

    def wait_until_done(self, spec_ids: set[str] | None = None, *, timeout_s: float = 0.0,
                        poll_s: float = 0.5) -> dict[str, Claim]:
        return self.all()

    @contextmanager
    def keepalive(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


MAX_RETRIES = 2  # a trial whose worker died is run again at most this often


def wait_for_creator(study: optuna.Study, timeout_s: float = 30.0) -> None:
    """A worker that loses the race to create the study may load it before its creator has
    written the attributes it is checked against (space, method, front, key); the metric names
    are written last, so wait for them (a study whose creator died keeps what it has)."""
    deadline = time.monotonic() + timeout_s
    while study.metric_names is None and time.monotonic() < deadline:
        time.sleep(0.05)


def retry_dead_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue a failed trial again (Optuna's own retry, as its heartbeat does for an RDB)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)(study, trial)
