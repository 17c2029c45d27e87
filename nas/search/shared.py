"""Acceptance rows shared by every worker of a storage: each architecture (heads, visual_keep,
inject_layer, depth, mlp, draft_vocab: `SubnetSpec.arch`) is scored once, by one worker, and
every worker reads its rows.

One teacher-forced pass scores every draft length of an architecture, so the unit of work and of
claiming is the architecture (`SubnetSpec.arch`: the spec with draft_len 1); its claim name
is that spec's id after ``triple:`` (the word the storage's claim names and column keep),
``triple:h4-v0.50-l12-g1`` or ``triple:h4-v0.50-l12-d2-m0.50-n0.25-g1``. The rows go to
`dreams_nas_acceptance`, a table beside Optuna's in the same database (the SQLite file beside a
journal), keyed by the acceptance *scope* -- the supernet, data set, dtype, token budget and
temperature the rows were scored with (`acceptance_scope`) -- so an Optuna study and an exhaustive
sweep of the same run share them, and rows of other inputs are never mixed in. Reads are incremental
(rows after the last sequence number seen). Triple claims live in the claims table under the study
name ``tau:<scope>``, with the same heartbeat, takeover and database clock as subnet claims.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from dreams_nas.nas.search.claims import create_tables
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from sqlalchemy import exc as sa_exc

TABLE = "dreams_nas_acceptance"
SCOPE_FIELDS = ("supernet_hash", "dataset_id", "dtype", "max_new_tokens", "temperature")
_metadata = sa.MetaData()
_rows = sa.Table(
    TABLE,
    _metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("scope", sa.String(64), nullable=False),
    sa.Column("spec_id", sa.String(128), nullable=False),
    sa.Column("triple", sa.String(128), nullable=False),
    sa.Column("row", sa.Text, nullable=False),  # AcceptanceRow.to_csv_row() as JSON
    sa.Column("worker", sa.String(256), nullable=False),
    sa.UniqueConstraint("scope", "spec_id", name="dreams_nas_acceptance_scope_spec"),
)


def arch_key(spec: SubnetSpec) -> str:
    """The claim name of `spec`'s architecture (the id of its draft_len-1 member)."""
    return "triple:" + spec.arch.id


def acceptance_scope(*sources: Any) -> dict[str, Any]:
    """The inputs acceptance rows depend on, from the first source that has each field (an
    `AcceptanceTable`, then the scorer)."""
    out: dict[str, Any] = {}
    for name in SCOPE_FIELDS:
        for source in sources:
            value = getattr(source, name, None)
            if value is not None:
                out[name] = value
                break
        else:
            out[name] = None
    # rows are greedy (temperature 0) unless a source says otherwise
    out["temperature"] = float(out["temperature"] or 0.0)
    return out


def scope_digest(scope: dict[str, Any]) -> str:
    text = json.dumps(scope, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class SharedRows:
    """The shared acceptance rows of one scope in the database at `url`."""

    def __init__(self, url: str, scope: dict[str, Any], worker: str) -> None:
        self.scope = dict(scope)
        self.digest = scope_digest(self.scope)
        self.worker = worker
        connect_args = {"timeout": 60} if url.startswith("sqlite") else {}
        self._engine = sa.create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        self._last = 0  # the highest sequence number read
        create_tables(_metadata, self._engine)

    @property
    def claims_name(self) -> str:
        """The study name under which this scope's architectures are claimed."""
        return f"tau:{self.digest}"

    def close(self) -> None:
        self._engine.dispose()

    def put(self, rows: Iterable[AcceptanceRow]) -> int:
        """Store rows (those already stored are left as they are). Returns how many were new."""
        added = 0
        for row in rows:
            try:
                with self._engine.begin() as conn:
                    conn.execute(sa.insert(_rows).values(
                        scope=self.digest, spec_id=row.spec.id, triple=arch_key(row.spec),
                        row=json.dumps(row.to_csv_row()), worker=self.worker))
                added += 1
            except sa_exc.IntegrityError:
                continue  # a row of this spec is already shared (a takeover rescored it)
        return added

    def pull(self) -> list[AcceptanceRow]:
        """The rows stored since the last pull (all of them on the first), checked as the
        acceptance CSV's rows are: a damaged row is an InputError, never used."""
        with self._engine.connect() as conn:
            found = conn.execute(
                sa.select(_rows.c.seq, _rows.c.spec_id, _rows.c.row)
                .where(_rows.c.scope == self.digest, _rows.c.seq > self._last)
                .order_by(_rows.c.seq)
            ).all()
        out = []
        for seq, spec_id, text in found:
            try:
                out.append(AcceptanceRow.from_csv_row(json.loads(text)))
            except (KeyError, ValueError, TypeError) as exc:
                raise InputError(
                    f"the shared acceptance row of {spec_id} (table {TABLE}, seq {seq}) is "
                    f"damaged ({exc}); delete that row so the architecture is scored again"
                ) from None
            self._last = max(self._last, int(seq))
        return out

    def scorers(self) -> dict[str, set[str]]:
        """Triple -> the workers whose rows of it are stored (one each when none was rescored)."""
        with self._engine.connect() as conn:
            found = conn.execute(sa.select(_rows.c.triple, _rows.c.worker)
                                 .where(_rows.c.scope == self.digest)).all()
        out: dict[str, set[str]] = {}
        for arch, worker in found:
            out.setdefault(arch, set()).add(worker)
        return out


def expand(arch: SubnetSpec, draft_lens: Sequence[int], asked: Iterable[SubnetSpec],
           trees: Sequence[Sequence[int]] = ()) -> list[SubnetSpec]:
    """Every spec of the architecture `arch` to score at once (its sizes kept): the
    space's chains (`draft_lens`) and token `trees`, and the shapes asked."""
    asked = list(asked)
    lens = sorted({int(g) for g in draft_lens} | {s.draft_len for s in asked if not s.tree})
    shapes = dict.fromkeys([*(tuple(t) for t in trees), *(s.tree for s in asked if s.tree)])
    return ([arch.replace(draft_len=g) for g in lens]
            + [arch.replace(tree=t) for t in shapes])
