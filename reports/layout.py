"""Where the report finds each file of a run folder (README "The run folder", SCHEMAS.md).

The writers get these paths from `supernet.core.runfolder.RunFolder`; reports imports no other
package, so it states them again here, one function per artefact, and
tests/test_copies_agree.py checks each one against RunFolder's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

RUN_JSON = "run.json"
REPORT_HTML = "report.html"
SPEC_JSON = "spec.json"  # inside each specs/<spec-id>/ folder


def run_json(run_dir: Path) -> Path:
    return run_dir / RUN_JSON


def latency_dir(run_dir: Path, hardware_id: str) -> Path:
    return run_dir / "latency" / hardware_id


def _latency_file(name: str, run_dir: Path, hardware_id: str) -> Path:
    return latency_dir(run_dir, hardware_id) / name


# The files of one hardware id's latency folder: function(run_dir, hardware_id) -> Path.
hardware_json = partial(_latency_file, "hardware.json")
predictor_json = partial(_latency_file, "predictor.json")


def acceptance_dir(run_dir: Path) -> Path:
    return run_dir / "acceptance"


def acceptance_csv(run_dir: Path, dataset_id: str) -> Path:
    """One file per dataset: the dataset id is the file's stem."""
    return acceptance_dir(run_dir) / f"{dataset_id}.csv"


def search_root(run_dir: Path) -> Path:
    """Holds one folder per searched hardware id."""
    return run_dir / "search"


def search_dir(run_dir: Path, hardware_id: str) -> Path:
    return search_root(run_dir) / hardware_id


def _search_file(name: str, run_dir: Path, hardware_id: str) -> Path:
    return search_dir(run_dir, hardware_id) / name


# The files of one hardware id's search folder: function(run_dir, hardware_id) -> Path.
trials_csv = partial(_search_file, "trials.csv")
pareto_csv = partial(_search_file, "pareto.csv")
history_csv = partial(_search_file, "history.csv")
best_json = partial(_search_file, "best.json")


def specs_root(run_dir: Path) -> Path:
    """Holds one folder per exported subnet."""
    return run_dir / "specs"


def spec_dir(run_dir: Path, spec_id: str) -> Path:
    return specs_root(run_dir) / spec_id


def spec_json(run_dir: Path, spec_id: str) -> Path:
    return spec_dir(run_dir, spec_id) / SPEC_JSON


def report_html(run_dir: Path) -> Path:
    return run_dir / REPORT_HTML
