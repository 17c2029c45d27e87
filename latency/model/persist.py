"""How a latency predictor sits on disk, in ``latency/<hardware-id>/``:

* ``predictor.skops``      the fitted `regressor.LatencyRegressor`, saved with skops (no pickle);
* ``predictor_train.csv``  the rows it was fitted on (what makes it reproducible);
* ``predictor.json``       its metrics, the profiled context range, its fingerprint, the schema
                           version, library versions and the skops file's sha256.

Nothing in a run folder is unpickled: a run folder someone sends you could carry a pickle that
runs their code when loaded, and a hash beside it proves nothing (they can write that too).
predictor.skops is read with skops trusting only scikit-learn's and numpy's types and ours
(`regressor.SKOPS_TRUSTED_TYPES`); a file naming any other type is refused before anything in
it is built. What it builds is then checked by type (`regressor.model_problem`): a scikit-learn
estimator skops trusts but `make_regressor` never builds (a `DummyRegressor` whose hash was
written beside it) is refused as well. A folder of another schema or scikit-learn version, or
whose skops file is missing, damaged or swapped, is refused in one line naming the refit that
writes it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dreams_nas.latency.kinds import DRAFT_KINDS
from dreams_nas.latency.model.regressor import SKOPS_TRUSTED_TYPES, model_problem
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS
from dreams_nas.supernet.core.versions import library_versions

# 9: the classes moved into latency.model (skops records their paths); a folder of another
#    schema is refused, its rows refitted by `dreams-nas profile --fit-only`
PREDICTOR_SCHEMA_VERSION = 9
MODEL_FILE = "predictor.skops"
TRAIN_COLUMNS = ("kind", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len",
                 "depth", "mlp", "draft_vocab", "context_len", "k", "median_ms")
REFIT = ("rerun `dreams-nas profile --fit-only` (it refits from profile.csv) with the --device "
         "and --threads it was profiled with, or `dreams-nas profile`")


def dump_model(model: Any) -> bytes:
    """predictor.skops's bytes; a type `load_model` will not trust or accept (a custom
    candidate regressor) is refused here, before anything is written."""
    import zipfile

    import skops.io as sio

    problem = model_problem(model)
    if problem:
        raise InputError(f"the latency model is not one loading accepts ({problem}); fit it "
                         "with the default candidate regressors")
    payload = sio.dumps(model, compression=zipfile.ZIP_DEFLATED)
    extra = sorted(set(sio.get_untrusted_types(data=payload)) - set(SKOPS_TRUSTED_TYPES))
    if extra:
        raise InputError(f"the latency model holds type(s) {extra} that loading does not trust; "
                         "fit it with the default candidate regressors")
    return payload


def load_model(directory: Path, meta: Mapping[str, Any]) -> Any:
    """The fitted regressor of predictor.skops: refused in one line (naming the refit) when
    the folder is of another schema or scikit-learn version, or the file is missing, damaged,
    swapped, names a type we do not trust or builds anything but what `make_regressor` builds
    (`regressor.model_problem`)."""
    import skops.io as sio

    path = directory / MODEL_FILE
    schema = meta.get("schema_version")
    saved = (meta.get("versions") or {}).get("scikit-learn")
    installed = library_versions().get("scikit-learn")
    if schema != PREDICTOR_SCHEMA_VERSION:
        raise InputError(f"the latency predictor in {directory} has schema {schema}; this "
                         f"dreams-nas reads schema {PREDICTOR_SCHEMA_VERSION}: {REFIT}")
    if saved != installed:
        raise InputError(f"the latency predictor in {directory} was fitted with scikit-learn "
                         f"{saved}; this is {installed}: {REFIT}")
    try:
        payload = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc}); {REFIT}") from None
    if hashlib.sha256(payload).hexdigest() != str(meta.get("skops_sha256")):
        raise InputError(f"{path} does not match the hash predictor.json records (damaged or "
                         f"replaced); {REFIT}")
    try:
        model = sio.loads(payload, trusted=list(SKOPS_TRUSTED_TYPES))
    except Exception as exc:  # noqa: BLE001 - an unreadable or refused file is one line
        raise InputError(f"cannot read {path} ({' '.join(str(exc).split())[:300]}); "
                         f"{REFIT}") from None
    problem = model_problem(model)
    if problem:
        raise InputError(f"{path} is not a latency model this dreams-nas fits "
                         f"({' '.join(problem.split())[:300]}); {REFIT}")
    return model


def read_train_rows(path: Path) -> pd.DataFrame:
    """The rows a saved predictor was fitted on (predictor_train.csv): a missing or unreadable
    file is one line naming it and how to write it again."""
    if not path.is_file():
        raise MissingArtefactError(f"no predictor training rows in {path}; {REFIT}")
    try:
        frame = pd.read_csv(path, dtype={"spec_id": str}, keep_default_na=False,
                            na_values={n: [""] for n in ("heads", "visual_keep", *SIZE_DEFAULTS)})
        frame = training_frame(frame)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"{path} cannot be read as predictor training rows ({why}); {REFIT}"
                         ) from None
    if frame.empty:  # they say what was profiled (sizes, contexts): none is nothing to predict
        raise InputError(f"{path} holds no predictor training rows; {REFIT}")
    return frame


def training_frame(rows: pd.DataFrame | Iterable[Mapping[str, Any]],
                   stat: str = "median_ms") -> pd.DataFrame:
    """`rows` as the columns the regressor is fitted on (`TRAIN_COLUMNS`); only ``ok`` rows
    when they carry a status. Rows made in memory without a size column (tests, notebooks)
    are at that size's default for draft rows. A row whose time (`median_ms`, holding `stat`)
    is not a positive number is refused in one line naming it (`InputError`)."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if "status" in frame.columns:
        frame = frame[frame["status"] == "ok"]
    missing = [c for c in ("kind", "heads", "visual_keep", "context_len", "k", "median_ms")
               if c not in frame.columns]
    if missing:
        raise InputError(f"latency rows lack column(s) {missing}")
    frame = frame[[c for c in TRAIN_COLUMNS if c in frame.columns]].copy()
    frame["spec_id"] = frame["spec_id"].fillna("").astype(str) if "spec_id" in frame else ""
    for name in ("heads", "visual_keep", "median_ms", *(n for n in SIZE_DEFAULTS if n in frame)):
        frame[name] = pd.to_numeric(frame[name], errors="coerce")
    drafted = frame["kind"].isin(DRAFT_KINDS).to_numpy()
    for name, default in SIZE_DEFAULTS.items():
        if name not in frame:
            frame[name] = np.where(drafted, float(default), np.nan)
    frame = frame[[c for c in TRAIN_COLUMNS if c in frame.columns]]
    for name in ("context_len", "k"):
        frame[name] = frame[name].astype(int)
    frame = frame.reset_index(drop=True)
    ms = frame["median_ms"].to_numpy(dtype=float)
    bad = np.flatnonzero(~(np.isfinite(ms) & (ms > 0)))
    if bad.size:
        row = frame.iloc[int(bad[0])]
        spec = f" of {row['spec_id']}" if row["spec_id"] else ""
        raise InputError(f"the {row['kind']} row{spec} at context_len {row['context_len']}, k "
                         f"{row['k']} has {stat} {ms[bad[0]]:g}: not a positive time in ms")
    return frame


def check_fingerprint(fingerprint: Mapping[str, Any], expected: Mapping[str, Any],
                      where: str | Path) -> None:
    """Each key of `expected` (e.g. the run's ``dtype`` and the target's ``architecture_hash``)
    must equal what the rows were timed with; one line naming both when not. A key the
    fingerprint lacks (a predictor fitted by hand, without one) is not checked."""
    for key, value in expected.items():
        have = fingerprint.get(key)
        if value is None or have is None or str(have) == str(value):
            continue
        raise InputError(
            f"the latency predictor in {where} was timed with {key} {have}, but this run has "
            f"{key} {value}: its latencies are another program's; profile this run's target "
            "and dtype (`dreams-nas profile`)")


def metrics_of(raw: Any, counts: Sequence[str] = ()) -> dict[str, float]:
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
