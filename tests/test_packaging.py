"""The installed package works from any folder, under its namespaced import names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "dreams-nas"


def test_imports_from_outside_the_repository(tmp_path) -> None:
    code = "import dreams_nas.nas, dreams_nas.latency, dreams_nas.supernet, dreams_nas.reports"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


def test_console_script_help_from_outside(tmp_path) -> None:
    exe = str(SCRIPT) if SCRIPT.exists() else shutil.which("dreams-nas")
    assert exe, "the dreams-nas console script is not installed"
    out = subprocess.run([exe, "--help"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "usage: dreams-nas" in out.stdout


def test_no_bare_top_level_names_are_installed(tmp_path) -> None:
    # `nas` and `reports` are other projects' names on PyPI: we must not shadow them.
    code = "import importlib.util as u; print([n for n in ('nas', 'reports', 'supernet', 'latency') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
