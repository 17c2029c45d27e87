"""The run folder: every artefact of one target + supernet, at paths every command agrees on.

```
dreams-run/
  run.json                       target, space, supernet (training settings, loss), aifd, versions
  supernet/                      config.json + model.safetensors (+ selfdistill.json, curve.csv,
                                 checkpoint/, features/: the target's training features)
  latency/<hardware-id>/         hardware.json, plan.json, profile.csv (append-only rows),
                                 predictor.skops, predictor_train.csv, predictor.json
  acceptance/<dataset-id>.csv    one row per (supernet, dataset, subnet, temperature)
  search/<hardware-id>/          study.db (Optuna), trials.csv, pareto.csv, history.csv, best.json
  specs/<spec-id>/               spec.json (deployable) + config.json + draft.safetensors
  report.html (+ report_figures/)
```

Every file's columns or keys, units and schema version: SCHEMAS.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import partialmethod
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.device import resolve_dtype
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import append_csv_rows, atomic_write_json, locked, read_json
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.targets import is_named_target
from dreams_nas.supernet.core.versions import library_versions

DEFAULT_RUN_DIR = "dreams-run"
# 2: the held-out evaluation's chain length is `supernet.train.convergence.draft_len`, the
#    built-in target's cache folder `builtin-target/builtin-v6-*`
RUN_SCHEMA_VERSION = 2
_SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_slug(kind: str, value: str) -> str:
    if not _SLUG_RE.match(value or ""):
        raise InputError(
            f"{kind} {value!r} is not a valid folder name; use letters, digits, '.', '_' and '-'"
        )
    return value


class RunFolder:
    """Knows every path of a run and reads/writes them safely."""

    def __init__(self, root: str | Path = DEFAULT_RUN_DIR) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.root)!r})"

    # --- paths ----------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def supernet_dir(self) -> Path:
        return self.root / "supernet"

    def latency_dir(self, hardware_id: str) -> Path:
        return self.root / "latency" / _check_slug("hardware id", hardware_id)

    def _latency_file(self, name: str, hardware_id: str) -> Path:
        return self.latency_dir(hardware_id) / name

    # The files of one hardware id's latency folder: method(hardware_id) -> Path.
    profile_csv = partialmethod(_latency_file, "profile.csv")
    predictor_skops = partialmethod(_latency_file, "predictor.skops")
    predictor_json = partialmethod(_latency_file, "predictor.json")
    hardware_json = partialmethod(_latency_file, "hardware.json")
    plan_json = partialmethod(_latency_file, "plan.json")

    def acceptance_csv(self, dataset_id: str) -> Path:
        return self.root / "acceptance" / f"{_check_slug('dataset id', dataset_id)}.csv"

    @property
    def search_root(self) -> Path:
        return self.root / "search"

    def search_dir(self, hardware_id: str) -> Path:
        return self.search_root / _check_slug("hardware id", hardware_id)

    def _search_file(self, name: str, hardware_id: str) -> Path:
        return self.search_dir(hardware_id) / name

    # The files of one hardware id's search folder: method(hardware_id) -> Path.
    study_db = partialmethod(_search_file, "study.db")
    trials_csv = partialmethod(_search_file, "trials.csv")
    pareto_csv = partialmethod(_search_file, "pareto.csv")
    best_json = partialmethod(_search_file, "best.json")
    history_csv = partialmethod(_search_file, "history.csv")

    @property
    def specs_root(self) -> Path:
        return self.root / "specs"

    def spec_dir(self, name: str) -> Path:
        return self.specs_root / _check_slug("spec name", name)

    def spec_json(self, name: str) -> Path:
        return self.spec_dir(name) / "spec.json"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    # --- what is there --------------------------------------------------------------
    def hardware_ids(self) -> list[str]:
        """Hardware ids that have a latency profile in this run."""
        base = self.root / "latency"
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "profile.csv").is_file())

    def dataset_ids(self) -> list[str]:
        base = self.root / "acceptance"
        return sorted(p.stem for p in base.glob("*.csv")) if base.is_dir() else []

    def require(self, path: Path, what: str, command: str) -> Path:
        """Return `path` if it exists; otherwise say what is missing and which command makes it."""
        if not path.exists():
            raise MissingArtefactError(f"no {what} in {path}; run `{command}` first")
        return path

    def require_supernet(self) -> Path:
        return self.require(
            self.supernet_dir / "model.safetensors",
            "trained supernet",
            "dreams-nas train` or `dreams-nas demo",
        ).parent

    # --- run.json -------------------------------------------------------------------
    def read_run(self) -> dict[str, Any]:
        """The run's metadata; an empty dict for a new run. A run.json of another schema
        version (another dreams-nas wrote it) is refused in one line: its artefacts are that
        version's, so the run starts again in a new folder."""
        if not self.run_json.exists():
            return {}
        data = read_json(self.run_json)
        if not isinstance(data, dict):
            raise InputError(f"{self.run_json} must hold a JSON object; "
                             "move it aside to start anew")
        version = data.get("schema_version")
        if version != RUN_SCHEMA_VERSION:
            raise InputError(
                f"{self.run_json} has schema_version {version!r}; this dreams-nas reads "
                f"schema {RUN_SCHEMA_VERSION}: run `dreams-nas train` (or `dreams-nas demo`) "
                "into a new --run folder")
        return data

    def update_run(self, **fields: Any) -> dict[str, Any]:
        """Merge `fields` into run.json (atomically, under a lock) and stamp the versions."""
        with locked(self.run_json):
            data = self.read_run()
            data.update(fields)
            data["schema_version"] = RUN_SCHEMA_VERSION
            data["versions"] = library_versions()
            atomic_write_json(self.run_json, data)
        return data

    def target_source(self) -> str | None:
        """What to load as the run's target (run.json's ``target`` block): its name for a
        built-in target (``builtin``, ``proxy-llava``: rebuilt when the cache lost it), else
        its checkpoint folder, or its id when that folder is gone; None when the run has no
        target yet."""
        info = self.read_run().get("target") or {}
        if not info:
            return None
        if is_named_target(info.get("id")):
            return str(info["id"])
        path = info.get("path")
        return str(path) if path and Path(path).exists() else str(info.get("id"))

    def dtype(self, asked: str | None, device: str) -> str:
        """The one dtype every command of this run computes in: run.json's ``dtype`` once a
        command recorded it; before that, `asked` resolved on `device` (None or ``auto``:
        float32 on the CPU, bfloat16 on a GPU that runs it natively, else float16).

        An explicit `asked` that differs from the recorded dtype is refused: the run's
        supernet, acceptance rows and latency profile would otherwise describe another
        program than the one measured."""
        recorded = self.read_run().get("dtype")
        auto = asked is None or str(asked).strip().lower() == "auto"
        if recorded is not None and auto:
            return str(recorded)
        value = resolve_dtype(asked, device)
        if recorded is not None and value != recorded:
            raise InputError(
                f"--dtype {value} differs from this run's dtype {recorded} ({self.run_json}): "
                f"drop --dtype (or pass --dtype {recorded}), or use another --run folder")
        return value

    def record_dtype(self, dtype: str) -> str:
        """Write `dtype` into run.json unless a dtype is there already (then refuse another)."""
        recorded = self.read_run().get("dtype")
        if recorded is None:
            self.update_run(dtype=dtype)
        elif recorded != dtype:
            raise InputError(f"this run computes in {recorded} ({self.run_json}), not {dtype}; "
                             "use another --run folder")
        return dtype

    def space(self) -> SearchSpace:
        data = self.read_run().get("space")
        if data is None:
            raise MissingArtefactError(
                f"no search space in {self.run_json}; run `dreams-nas train` or "
                "`dreams-nas demo` first"
            )
        return SearchSpace.from_dict(data)

    def save_space(self, space: SearchSpace) -> None:
        self.update_run(space=space.to_dict())

    # --- writing --------------------------------------------------------------------
    def write_json(self, path: Path, data: Any) -> Path:
        return atomic_write_json(path, data)

    def append_rows(
        self, path: Path, rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]
    ) -> int:
        return append_csv_rows(path, rows, fieldnames)
