"""The installed package works from any folder, under its namespaced import names."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
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
    code = ("import importlib.util as u; "
            "print([n for n in ('nas', 'reports', 'supernet', 'latency') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def _package_folders() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    names = []
    for top in ("nas", "latency", "supernet", "reports"):
        for init in sorted((root / top).rglob("__init__.py")):
            names.append("dreams_nas." + ".".join(init.parent.relative_to(root).parts))
    return names


def test_pyproject_names_every_package_folder() -> None:
    root = Path(__file__).resolve().parents[1]
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(listed) == sorted(_package_folders())


def test_every_module_folder_is_a_package() -> None:
    root = Path(__file__).resolve().parents[1]
    for top in ("nas", "latency", "supernet", "reports"):
        for module in (root / top).rglob("*.py"):
            assert (module.parent / "__init__.py").is_file(), f"{module.parent} has no __init__.py"


def test_supernet_core_imports_no_torch(tmp_path) -> None:
    code = ("import sys, pkgutil, importlib, dreams_nas.supernet.core as core\n"
            "for m in pkgutil.iter_modules(core.__path__):\n"
            "    importlib.import_module(f'dreams_nas.supernet.core.{m.name}')\n"
            "print(sorted(n for n in ('torch', 'transformers', 'optuna', 'sklearn') "
            "if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"
