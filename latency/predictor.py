"""Fit, evaluate, save and load one hardware id's latency predictor.

Saved next to the profile, in ``latency/<hardware-id>/``:

* ``predictor.skops``      the fitted model (`step_model.StepLatencyModel`), saved with skops
                           (fast to load, no pickle);
* ``predictor_train.csv``  the rows it was fitted on (what makes it reproducible);
* ``predictor.json``       the regressor of each kind, CV scores, held-out metrics (pooled and
                           per kind) and rows, the profiled context range, library versions.

Nothing in a run folder is unpickled: a run folder someone sends you could carry a pickle that
runs their code when loaded, and a hash beside it proves nothing (they can write that too).
`LatencyPredictor.load` reads predictor.skops with skops, trusting only scikit-learn's and
numpy's types and ours (`step_model.SKOPS_TRUSTED_TYPES`); a file naming any other type is
refused before anything in it is built. A folder saved before (``predictor.joblib``) is
never read: the predictor is refitted from its saved rows. So is one whose recorded
scikit-learn or schema version differs from this one, or whose skops file is missing, damaged,
swapped or refused; the refit is saved in the current format (so it is paid once, not on every
run).

A metric that is undefined (Kendall's tau of a single held-out row) is NaN in memory and null in
predictor.json, which is strict JSON (`supernet.core.io.atomic_write_json`).

`predict_ms(kind, spec, context_len, k)` is what the search asks of it (the `LatencyModel`
protocol of `dreams_nas.nas.search.candidate`). The model is linear in the context beyond the
profiled contexts, yet a search is refused at a context outside them (`check_context`), up to
`CONTEXT_MARGIN` of their span.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.estimators import latency_metrics
from dreams_nas.latency.plan import DRAFT_KINDS
from dreams_nas.latency.step_model import SKOPS_TRUSTED_TYPES, make_latency_model
from dreams_nas.latency.validation import holdout_split, metrics_by_kind
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
)
from dreams_nas.supernet.core.space import SIZE_DEFAULTS, SubnetSpec
from dreams_nas.supernet.core.versions import library_versions

log = logging.getLogger("dreams_nas.latency")
TRAIN_COLUMNS = ("kind", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len",
                 "depth", "mlp", "draft_vocab", "context_len", "k", "median_ms")
# 3: the model is predictor.skops (skops), no longer predictor.joblib (a pickle)
# 4: token trees: draft steps over a tree level (draft_width) and tree verifies (is_tree)
# 5: elastic depth and MLP width: rows carry depth and mlp, features blocks = 2 * depth + 1 and
#    its products (a schema-4 folder is refitted from its rows, their draft rows at depth 1)
# 6: one model per kind: draft kinds linear in the context, target steps interpolated from their
#    own measurements; grouped validation, metrics per kind, the profiled context range
# 7: the draft vocabulary: rows carry draft_vocab, features the LM head's rows (draft_vocab and
#    extra_x_draft_vocab) and draft_vocab's products (a schema-6 model reads fewer features, so
#    its folder is refitted from its rows, their draft rows at the whole vocabulary)
# 8: a target kind is predicted by a least-squares surface over (k, context) instead of its
#    table when that predicts left-out rows clearly better (`target_steps`; a schema-7 folder is
#    refitted from its rows)
PREDICTOR_SCHEMA_VERSION = 8
MODEL_FILE = "predictor.skops"
LEGACY_PICKLE = "predictor.joblib"  # saved before schema 3; never unpickled, removed on save


# A search may run at most this share of the profiled contexts' span outside them. The context it
# runs at is itself an estimate (the eval prompts' median length plus half the answer), and a
# least-squares line's standard error a tenth of the span beyond its data is only ~15 % above
# its error at the data's edge (variance ~ 1 + 12 (x - mean)^2 / span^2: 4 at the edge, 5.3
# there); farther out, the error grows with the distance and is not worth trusting. A profile
# at one context has no span: any other context is refused.
CONTEXT_MARGIN = 0.1


@dataclass
class LatencyPredictor:
    """A fitted predictor of one hardware id, with how well it predicted unseen rows."""

    hardware_id: str
    model: Any  # the fitted `StepLatencyModel`
    train_rows: pd.DataFrame
    visual_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)  # pooled over the held-out rows
    # {metric kind: metrics of its held-out rows + n} (`validation.metrics_by_kind`)
    metrics_by_kind: dict[str, dict[str, float]] = field(default_factory=dict)
    holdout: list[dict[str, Any]] = field(default_factory=list)
    n_holdout: int = 0
    holdout_fraction: float = 0.0  # the share of grid points asked to be held out
    seed: int = 0
    stat: str = "median_ms"  # the per-row statistic the model was fitted on
    # what the timed rows depend on besides the hardware id (dtype, software stack, the
    # target's architecture hash): a predictor answers only for these (`check_fingerprint`)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    _sizes: dict[str, tuple[float, float]] | None = field(default=None, init=False, repr=False,
                                                          compare=False)

    # --- prediction ---------------------------------------------------------------------
    def predict_rows(self, rows: pd.DataFrame) -> np.ndarray:
        """Milliseconds for rows with columns kind, heads, visual_keep, depth, mlp, draft_vocab,
        context_len, k (without depth, mlp or draft_vocab: 1 there)."""
        return np.asarray(self.model.predict(rows), dtype=float)

    def draft_ms(self, specs: Sequence[SubnetSpec], context_len: int,
                 kind: str = "draft", k: int = 1) -> np.ndarray:
        """One draft step of each spec (its inject_layer and draft_len do not change it):
        kind ``draft`` a hot step (over `k` nodes: a token tree's level), ``draft_first`` the
        cycle's first step, right after the target's verify. A spec whose depth, mlp or
        draft_vocab lies outside the profiled range is refused (`check_sizes`): it would be
        extrapolated."""
        specs = list(specs)
        self.check_sizes(specs)
        rows = pd.DataFrame({"kind": kind, "heads": [s.heads for s in specs],
                             "visual_keep": [s.visual_keep for s in specs],
                             "depth": [s.depth for s in specs], "mlp": [s.mlp for s in specs],
                             "draft_vocab": [s.draft_vocab for s in specs],
                             "context_len": int(context_len), "k": int(k)})
        return self.predict_rows(rows)

    def size_range(self) -> dict[str, tuple[float, float]]:
        """{depth/mlp/draft_vocab: (lowest, highest)} over the draft rows fitted on (empty
        without any; a size without its column: its default, 1)."""
        if self._sizes is None:
            drafts = self.train_rows[self.train_rows["kind"].isin(DRAFT_KINDS)]
            self._sizes = {} if drafts.empty else {
                name: ((float(drafts[name].min()), float(drafts[name].max()))
                       if name in drafts else (float(default), float(default)))
                for name, default in SIZE_DEFAULTS.items()}
        return self._sizes

    def check_sizes(self, specs: Sequence[SubnetSpec]) -> None:
        """Refuse specs deeper or shallower, wider or narrower, or with a larger or smaller
        draft vocabulary than any draft row profiled: the regressor would extrapolate their cost
        (a profile made before the space searched depth and width holds depth 1 and the whole
        MLP only; one made before the draft vocabulary, the whole vocabulary only)."""
        for name, (low, high) in self.size_range().items():
            outside = sorted({getattr(s, name) for s in specs
                              if not low - 1e-9 <= getattr(s, name) <= high + 1e-9})
            if outside:
                span = f"{low:g}" if low == high else f"{low:g}..{high:g}"
                raise InputError(
                    f"the latency predictor of {self.hardware_id} was profiled at {name} {span}, "
                    f"not at {name} {', '.join(f'{v:g}' for v in outside)}; rerun "
                    "`dreams-nas profile` with the run's search space to time them")

    # --- the profiled contexts -------------------------------------------------------------
    def contexts(self) -> list[int]:
        """The context lengths the rows were timed at, ascending."""
        return sorted({int(c) for c in self.train_rows["context_len"]})

    def context_range(self) -> tuple[int, int]:
        """(shortest, longest) context length profiled."""
        contexts = self.contexts()
        return contexts[0], contexts[-1]

    def allowed_contexts(self) -> tuple[float, float]:
        """The contexts a search may run at: the profiled range widened by `CONTEXT_MARGIN` of
        its span on each side (none for a profile at one context)."""
        low, high = self.context_range()
        margin = CONTEXT_MARGIN * (high - low)
        return low - margin, high + margin

    def check_context(self, context_len: int, source: str = "") -> None:
        """Refuse a context outside `allowed_contexts`: one line naming the context (and
        `source`, where it comes from), the profiled range and the `dreams-nas profile
        --context-lengths` that spans it."""
        low, high = self.allowed_contexts()
        if low - 1e-9 <= context_len <= high + 1e-9:
            return
        first, last = self.context_range()
        span = f"{first}" if first == last else f"{first}..{last}"
        slack = ("" if first == last else
                 f" (a search may lie up to {CONTEXT_MARGIN:.0%} of that span outside it: "
                 f"{low:g}..{high:g})")
        grid = " ".join(str(c) for c in sorted({*self.contexts(), int(context_len)}))
        raise InputError(
            f"the search runs at context length {int(context_len)}"
            f"{f' ({source})' if source else ''}, outside the contexts the latency "
            f"profile of {self.hardware_id} was timed at: {span}{slack}; its predictions are "
            "not trusted that far from its measurements: re-profile with a context grid "
            f"spanning it, e.g. `dreams-nas profile --context-lengths {grid}`")

    def tree_verify_ms(self, k: Sequence[int], context_len: int) -> np.ndarray:
        """The target's verify of a token tree over k positions (its nodes and the root)."""
        ks = np.atleast_1d(np.asarray(k, dtype=int))
        rows = pd.DataFrame({"kind": "verify_tree", "heads": np.nan, "visual_keep": np.nan,
                             "context_len": int(context_len), "k": ks})
        return self.predict_rows(rows)

    def cycle_profiled(self, tree: bool = False) -> bool:
        """Whether the profile timed the speculative cycle's own work (kind ``cycle``, or
        ``cycle_tree`` with `tree`); a profile made before that kind existed did not."""
        return ("cycle_tree" if tree else "cycle") in getattr(self.model, "target_models_", {})

    def cycle_ms(self, k: Sequence[int], context_len: int, tree: bool = False) -> np.ndarray:
        """The speculative cycle's work outside the models' forwards (acceptance, cache
        rollback, bookkeeping) per cycle of k = gamma + 1 positions (`tree`: a token tree of
        k - 1 nodes). 0 where the profile has no such rows (`cycle_profiled`): the search then
        prices no overhead and says so."""
        ks = np.atleast_1d(np.asarray(k, dtype=int))
        if not self.cycle_profiled(tree):
            return np.zeros(len(ks))
        rows = pd.DataFrame({"kind": "cycle_tree" if tree else "cycle", "heads": np.nan,
                             "visual_keep": np.nan, "context_len": int(context_len), "k": ks})
        return self.predict_rows(rows)

    def first_draft_ms(self, specs: Sequence[SubnetSpec], context_len: int) -> np.ndarray:
        """The first draft step of a cycle (right after the target's verify) of each spec."""
        return self.draft_ms(specs, context_len, kind="draft_first")

    def target_ms(self, k: int | Sequence[int], context_len: int) -> np.ndarray | float:
        """The target's step over k positions (k = 1: decode; k = gamma + 1: verify)."""
        ks = np.atleast_1d(np.asarray(k, dtype=int))
        rows = pd.DataFrame({"kind": np.where(ks == 1, "decode", "verify"), "heads": np.nan,
                             "visual_keep": np.nan, "context_len": int(context_len), "k": ks})
        out = self.predict_rows(rows)
        return float(out[0]) if np.ndim(k) == 0 else out

    def decode_ms(self, context_len: int) -> float:
        return float(self.target_ms(1, context_len))

    def verify_ms(self, k: int, context_len: int) -> float:
        return float(self.target_ms(k, context_len))

    def predict_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        """One step's milliseconds: kind draft/draft_first (of `spec`), verify (over k
        positions) or decode; the search's `LatencyModel` protocol."""
        if kind in ("draft", "draft_first"):
            if spec is None:
                raise ValueError(f"a {kind} latency needs a spec")
            return float(self.draft_ms([spec], context_len, kind=kind, k=k)[0])
        if kind == "verify":
            return self.verify_ms(k, context_len)
        if kind == "verify_tree":
            return float(self.tree_verify_ms([k], context_len)[0])
        if kind == "decode":
            return self.decode_ms(context_len)
        if kind in ("cycle", "cycle_tree"):
            return float(self.cycle_ms([k], context_len, tree=kind == "cycle_tree")[0])
        raise ValueError(f"latency kind {kind!r} is not one of draft, draft_first, verify, "
                         "verify_tree, decode, cycle, cycle_tree")

    # --- fitting ------------------------------------------------------------------------
    @classmethod
    def fit(cls, rows: pd.DataFrame, hardware_id: str, *, visual_tokens: int = 0,
            holdout: float = 0.2, seed: int = 0, candidates: Any = None,
            stat: str = "median_ms", fingerprint: Mapping[str, Any] | None = None
            ) -> LatencyPredictor:
        """Evaluate on a held-out share of `rows`, then fit the saved model on all of them.

        stat: the per-row statistic fitted and predicted -- the median (default), or ``p10_ms``
        (what `dreams-nas profile` fits): the fastest samples are the ones other load and the
        machine's drift touched least, so they rank and predict steps best on a shared CPU.
        """
        if stat not in ("median_ms", "p10_ms"):
            raise InputError(f"stat={stat!r} must be median_ms or p10_ms")
        rows = pd.DataFrame(rows)
        if stat != "median_ms":
            rows = rows.assign(median_ms=rows[stat])
        return cls._fitted(_training_frame(rows), hardware_id, visual_tokens=visual_tokens,
                           holdout=holdout, seed=seed, candidates=candidates, stat=stat,
                           fingerprint=fingerprint)

    @classmethod
    def _fitted(cls, rows: pd.DataFrame, hardware_id: str, *, visual_tokens: int,
                holdout: float, seed: int, candidates: Any = None, stat: str = "median_ms",
                fingerprint: Mapping[str, Any] | None = None) -> LatencyPredictor:
        """`fit` on a training frame (`_training_frame`: `median_ms` holds the statistic)."""
        if len(rows) < 4:
            raise InputError(
                f"only {len(rows)} successful measurements to fit a latency predictor on; "
                "profile more (a larger --budget or more --context-lengths)"
            )
        metrics: dict[str, float] = {}
        by_kind: dict[str, dict[str, float]] = {}
        held: list[dict[str, Any]] = []
        n_holdout = 0
        if holdout > 0:
            # whole grid points: a point's draft and draft_first rows on one side (`validation`)
            train, hold = holdout_split(rows, holdout, seed)
            if hold.any():
                probe = make_latency_model(visual_tokens, candidates, random_state=seed)
                probe.fit(rows[train], rows.loc[train, "median_ms"].to_numpy())
                measured = rows.loc[hold, "median_ms"].to_numpy()
                predicted = probe.predict(rows[hold])
                metrics = latency_metrics(measured, predicted)
                by_kind = metrics_by_kind(rows[hold], measured, predicted)
                n_holdout = int(hold.sum())
                held = [
                    {"kind": r.kind, "spec_id": r.spec_id or None,
                     "context_len": int(r.context_len), "k": int(r.k),
                     "measured_ms": float(m), "predicted_ms": float(p)}
                    for r, m, p in zip(rows[hold].itertuples(index=False), measured, predicted,
                                       strict=True)
                ]
        model = make_latency_model(visual_tokens, candidates, random_state=seed)
        model.fit(rows, rows["median_ms"].to_numpy())
        return cls(hardware_id=hardware_id, model=model, train_rows=rows,
                   visual_tokens=visual_tokens, metrics=metrics, metrics_by_kind=by_kind,
                   holdout=held, n_holdout=n_holdout, holdout_fraction=float(holdout),
                   seed=seed, stat=stat, fingerprint=dict(fingerprint or {}))

    def check_fingerprint(self, expected: Mapping[str, Any], where: str | Path = "") -> None:
        """Refuse to predict for another program (`check_fingerprint`)."""
        check_fingerprint(self.fingerprint, expected, where or self.hardware_id)

    # --- persistence --------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The predictor.json document."""
        regressors = self.model.regressors()
        low, high = self.context_range()
        return {
            "schema_version": PREDICTOR_SCHEMA_VERSION,
            "hardware_id": self.hardware_id, "regressor": regressor_summary(regressors),
            "regressors": regressors, "cv_scores": self.model.cv_scores(),
            "cv_metric": ("root mean squared relative error of ms, grouped K-fold over grid "
                          "points, per draft kind; mean relative error of each row left out, "
                          "per target kind (its table and its surface); lower is better"),
            "metrics": self.metrics, "metrics_by_kind": self.metrics_by_kind,
            "context_range": [low, high], "context_margin": CONTEXT_MARGIN,
            "holdout": self.holdout, "holdout_fraction": self.holdout_fraction,
            "n_train": len(self.train_rows) - self.n_holdout, "n_holdout": self.n_holdout,
            "n_fit": len(self.train_rows), "visual_tokens": self.visual_tokens, "seed": self.seed,
            "stat": self.stat, "fingerprint": self.fingerprint,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": library_versions(),
        }

    def save(self, directory: str | Path) -> Path:
        """Write predictor_train.csv, predictor.skops and predictor.json (with the skops
        file's hash) to `directory`; remove a pickle (predictor.joblib) saved there before."""
        directory = Path(directory)
        atomic_write_text(directory / "predictor_train.csv", self.train_rows.to_csv(index=False))
        payload = _dump_model(self.model)
        atomic_write_bytes(directory / MODEL_FILE, payload)
        # the file's hash: a damaged or swapped file is refitted, never loaded
        atomic_write_json(directory / "predictor.json",
                          {**self.report(), "skops_sha256": hashlib.sha256(payload).hexdigest()})
        (directory / LEGACY_PICKLE).unlink(missing_ok=True)
        return directory

    @classmethod
    def load(cls, directory: str | Path, expect: Mapping[str, Any] | None = None
             ) -> LatencyPredictor:
        """Load the saved predictor, or refit it from its saved rows when the saved model cannot
        be used (`_saved_model`). expect: fingerprint values the caller needs
        (`check_fingerprint`), checked first."""
        directory = Path(directory)
        meta_path = directory / "predictor.json"
        if not meta_path.is_file():
            raise MissingArtefactError(
                f"no latency predictor in {directory}; run `dreams-nas profile` first"
            )
        meta = read_json(meta_path)
        if not isinstance(meta, dict) or not isinstance(meta.get("hardware_id"), str):
            raise InputError(f"{meta_path} is not a predictor.json (no JSON object with a "
                             "hardware_id); rerun `dreams-nas profile --fit-only` to write it "
                             "again")
        fingerprint = dict(meta.get("fingerprint") or _legacy_fingerprint(directory))
        check_fingerprint(fingerprint, expect or {}, directory)
        rows = _read_train_rows(directory / "predictor_train.csv")
        try:
            seed = int(meta.get("seed", 0))
            visual_tokens = int(meta.get("visual_tokens", 0))
            n_holdout = int(meta.get("n_holdout", 0))
        except (TypeError, ValueError) as exc:
            raise InputError(f"{meta_path} holds a non-integer seed, visual_tokens or n_holdout "
                             f"({exc}); rerun `dreams-nas profile --fit-only` to write it "
                             "again") from None
        stat = str(meta.get("stat", "median_ms"))
        model = _saved_model(directory, meta, len(rows))
        if model is None:  # refitted, and evaluated again: the metrics are the new model's
            out = cls._fitted(rows, meta["hardware_id"], visual_tokens=visual_tokens,
                              holdout=_holdout_share(meta, n_holdout, len(rows)), seed=seed,
                              stat=stat, fingerprint=fingerprint)
            out._resave(directory)
            return out
        by_kind = meta.get("metrics_by_kind")
        return cls(hardware_id=meta["hardware_id"], model=model, train_rows=rows,
                   visual_tokens=visual_tokens, metrics=_metrics_of(meta.get("metrics")),
                   metrics_by_kind={str(k): _metrics_of(v, counts=("n",))
                                    for k, v in by_kind.items()}
                   if isinstance(by_kind, Mapping) else {},
                   holdout=list(meta.get("holdout") or []), n_holdout=n_holdout,
                   holdout_fraction=_holdout_share(meta, n_holdout, len(rows)),
                   seed=seed, stat=stat, fingerprint=fingerprint)

    def _resave(self, directory: Path) -> None:
        """Rewrite a refitted predictor so the next run loads it instead of refitting again; a
        folder this process cannot write (a shared, read-only run) only costs that refit."""
        try:
            self.save(directory)
        except OSError as exc:
            log.warning("cannot rewrite the refitted predictor in %s (%s); it will be refitted "
                        "again next time", directory, exc)


def _holdout_share(meta: Mapping[str, Any], n_holdout: int, n_rows: int) -> float:
    """The hold-out share predictor.json asked for (`holdout_fraction`); for a file written
    before it recorded one, the share it held out (n_holdout of the rows)."""
    share = meta.get("holdout_fraction")
    if isinstance(share, int | float) and not isinstance(share, bool) and 0 <= share < 1:
        return float(share)
    return min(0.9, max(0.0, n_holdout / n_rows)) if n_rows else 0.0


def regressor_summary(regressors: Mapping[str, str]) -> str:
    """predictor.json's `regressor`, one line: ``draft linear, draft_first linear; target steps
    interpolated`` (every draft kind's choice, then the target kinds': one word when they agree,
    else each kind's)."""
    drafts = [f"{kind} {name}" for kind, name in regressors.items() if kind in DRAFT_KINDS]
    target = {kind: name for kind, name in regressors.items() if kind not in DRAFT_KINDS}
    parts = [", ".join(drafts)] if drafts else []
    if len(set(target.values())) == 1:
        parts.append(f"target steps {next(iter(target.values()))}")
    elif target:
        parts.append("target steps " + ", ".join(f"{k} {n}" for k, n in target.items()))
    return "; ".join(parts) or "none"


def _metrics_of(raw: Any, counts: Sequence[str] = ()) -> dict[str, float]:
    """predictor.json's `metrics` as floats: null (an undefined metric, e.g. Kendall's tau of one
    held-out row, written as null by the strict JSON writer) is NaN again, as `fit` made it;
    the keys in `counts` (``n``) stay whole numbers."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in raw.items():
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if key in counts:
            if number is not None and np.isfinite(number):
                out[str(key)] = int(number)
        else:  # null, or what no writer writes (an edited file): undefined
            out[str(key)] = float("nan") if number is None else float(number)
    return out


def _dump_model(model: Any) -> bytes:
    """predictor.skops's bytes; a warning when the model holds a type `load` will not trust
    (a custom candidate regressor): then every load refits, with the default candidates."""
    import zipfile

    import skops.io as sio

    payload = sio.dumps(model, compression=zipfile.ZIP_DEFLATED)
    extra = sorted(set(sio.get_untrusted_types(data=payload)) - set(SKOPS_TRUSTED_TYPES))
    if extra:
        log.warning("the latency model holds type(s) %s that loading does not trust; it will be "
                    "refitted from its rows, with the default regressors, when loaded", extra)
    return payload


def _saved_model(directory: Path, meta: Mapping[str, Any], n_rows: int) -> Any:
    """The fitted pipeline of predictor.skops, or None (and one log line saying why) when it
    must be refitted: a pickle-only folder (never unpickled), another schema or scikit-learn
    version, a missing, damaged or swapped file, or one naming a type we do not trust."""
    import skops.io as sio

    path = directory / MODEL_FILE
    schema = meta.get("schema_version", 1)
    saved = (meta.get("versions") or {}).get("scikit-learn")
    installed = library_versions().get("scikit-learn")
    why = ""
    if not path.is_file() and (directory / LEGACY_PICKLE).is_file():
        why = (f"{directory / LEGACY_PICKLE} is a pickle, which is never unpickled (it could "
               "run code)")
    elif schema != PREDICTOR_SCHEMA_VERSION:
        why = f"predictor in {directory} has schema {schema}, this is {PREDICTOR_SCHEMA_VERSION}"
    elif saved != installed:
        why = (f"predictor in {directory} was fitted with scikit-learn {saved}, this is "
               f"{installed}")
    else:
        try:
            payload = path.read_bytes()
        except OSError as exc:
            payload, why = b"", f"cannot read {path} ({exc})"
        recorded = meta.get("skops_sha256")
        if not why and recorded and hashlib.sha256(payload).hexdigest() != str(recorded):
            why = f"{path} does not match the hash predictor.json records (damaged or replaced)"
        if not why:
            try:
                return sio.loads(payload, trusted=list(SKOPS_TRUSTED_TYPES))
            except Exception as exc:  # noqa: BLE001 - an unreadable or refused file means: refit
                why = f"cannot read {path} ({' '.join(str(exc).split())[:300]})"
    log.warning("%s; refitting from its %d saved rows", why, n_rows)
    return None


def _read_train_rows(path: Path) -> pd.DataFrame:
    """The rows a saved predictor was fitted on (predictor_train.csv): a missing or unreadable
    file is one line naming it and how to write it again."""
    fix = ("rerun `dreams-nas profile --fit-only` (it refits from profile.csv) with the --device "
           "and --threads it was profiled with, or `dreams-nas profile`")
    if not path.is_file():
        raise MissingArtefactError(f"no predictor training rows in {path}; {fix}")
    try:
        frame = pd.read_csv(path, dtype={"spec_id": str}, keep_default_na=False,
                            na_values={n: [""] for n in ("heads", "visual_keep", *SIZE_DEFAULTS)})
        frame = _training_frame(frame)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{path} cannot be read as predictor training rows ({why}); {fix}"
                         ) from None
    if frame.empty:  # they say what was profiled (sizes, contexts): none is nothing to predict
        raise InputError(f"{path} holds no predictor training rows; {fix}")
    return frame


def check_fingerprint(fingerprint: Mapping[str, Any], expected: Mapping[str, Any],
                      where: str | Path) -> None:
    """Each key of `expected` (e.g. the run's ``dtype`` and the target's ``architecture_hash``)
    must equal what the rows were timed with; one line naming both when not. A key the
    fingerprint lacks (a predictor fitted before it recorded it) is not checked."""
    for key, value in expected.items():
        have = fingerprint.get(key)
        if value is None or have is None or str(have) == str(value):
            continue
        raise InputError(
            f"the latency predictor in {where} was timed with {key} {have}, but this run has "
            f"{key} {value}: its latencies are another program's; profile this run's target "
            "and dtype (`dreams-nas profile`)")


def _legacy_fingerprint(directory: Path) -> dict[str, Any]:
    """A predictor saved before predictor.json recorded its fingerprint: the dtype and stack
    of the hardware.json beside it (the rows' own)."""
    path = directory / "hardware.json"
    data = read_json(path) if path.is_file() else {}
    if not isinstance(data, dict):
        return {}
    return {k: data.get(k) for k in ("hardware_id", "dtype", "torch", "transformers") if k in data}


def _training_frame(rows: pd.DataFrame | Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "status" in frame.columns:
        frame = frame[frame["status"] == "ok"]
    missing = [c for c in ("kind", "heads", "visual_keep", "context_len", "k", "median_ms")
               if c not in frame.columns]
    if missing:
        raise InputError(f"latency rows lack column(s) {missing}")
    frame = frame[[c for c in TRAIN_COLUMNS if c in frame.columns]].copy()
    frame["spec_id"] = frame.get("spec_id", "").fillna("").astype(str) if "spec_id" in frame else ""
    for name in ("heads", "visual_keep", "median_ms", *(n for n in SIZE_DEFAULTS if n in frame)):
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    # Rows from before elastic depth and MLP width or the draft vocabulary (no such column):
    # draft rows at the paper's size, target rows without one (NaN, as their heads).
    drafted = frame["kind"].isin(DRAFT_KINDS).to_numpy()
    for name, default in SIZE_DEFAULTS.items():
        if name not in frame:
            frame[name] = np.where(drafted, float(default), np.nan)
    frame = frame[[c for c in TRAIN_COLUMNS if c in frame.columns]]
    for name in ("context_len", "k"):
        frame[name] = frame[name].astype(int)
    return frame.reset_index(drop=True)
