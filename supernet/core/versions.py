"""Library versions recorded next to every artefact (read from metadata, imports nothing heavy)."""

from __future__ import annotations

import platform
from importlib import metadata

_PACKAGES = ("dreams-nas", "torch", "transformers", "optuna", "scikit-learn", "numpy", "pandas")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
