"""The named targets' cache (the built-in target and the proxies): built once on first use,
reused, never half-written.

`ensure_builtin_target` (and `ensure_proxy_target`, for the real-shaped proxies) builds it into
``$DREAMS_NAS_CACHE`` (default ``~/.cache/dreams-nas``) under a version key, in a temporary
folder that is renamed into place only after a completion marker (with the sha256 of every
file) is written; a folder whose marker is missing or whose files do not match is rebuilt,
never used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dreams_nas.supernet.builtin.build import build_builtin_target
from dreams_nas.supernet.builtin.proxy import PROXY_VERSION, build_proxy_target, get_proxy
from dreams_nas.supernet.builtin.variants import BUILTIN_VERSION, get_variant
from dreams_nas.supernet.core.io import atomic_write_json, default_cache_dir, file_sha256, locked

log = logging.getLogger("dreams_nas")
MARKER = "dreams-nas-complete.json"


def builtin_target_dir(cache_dir: str | Path | None = None, variant: str = "default",
                    seed: int = 0) -> Path:
    """Where the cached built-in target of this version, variant and seed lives."""
    get_variant(variant)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "builtin-target" / f"{BUILTIN_VERSION}-{variant}-s{seed}"


def read_complete_marker(folder: str | Path) -> dict[str, Any] | None:
    """The completion marker of a cached build, or None when missing, unreadable or stale.

    Stale means a file listed in the marker is missing or its sha256 differs (a half-written
    or damaged folder).
    """
    folder = Path(folder)
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, digest in files.items():
        path = folder / name
        if not path.is_file() or file_sha256(path) != digest:
            return None
    return marker


def ensure_builtin_target(
    cache_dir: str | Path | None = None,
    variant: str = "default",
    seed: int = 0,
    progress: bool = True,
    threads: int | None = None,
) -> Path:
    """The checkpoint folder of the built-in target, built (minutes) on first use, then reused."""
    return ensure_builtin_target_with_metrics(cache_dir, variant, seed, progress, threads)[0]


def ensure_builtin_target_with_metrics(
    cache_dir: str | Path | None = None,
    variant: str = "default",
    seed: int = 0,
    progress: bool = True,
    threads: int | None = None,
    rebuild: bool = False,
) -> tuple[Path, dict[str, Any], bool]:
    """(folder, build metrics, came from the cache); `rebuild` builds afresh and swaps it in."""
    folder = builtin_target_dir(cache_dir, variant, seed)

    def build(tmp: Path) -> dict[str, Any]:
        return build_builtin_target(tmp, variant=variant, seed=seed, progress=progress,
                                 threads=threads)

    return _ensure_built(folder, build, {"version": BUILTIN_VERSION, "variant": variant,
                                         "seed": seed}, f"the built-in target {variant}",
                         "minutes", rebuild)


def proxy_target_dir(cache_dir: str | Path | None = None, name: str = "proxy-llava",
                     seed: int = 0) -> Path:
    """Where the cached proxy target `name` of this version and seed lives."""
    get_proxy(name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / "proxy-target" / f"{PROXY_VERSION}-{name}-s{seed}"


def ensure_proxy_target(name: str = "proxy-llava", cache_dir: str | Path | None = None,
                        seed: int = 0, rebuild: bool = False
                        ) -> tuple[Path, dict[str, Any], bool]:
    """(folder, build metrics, came from the cache) of the real-shaped proxy target `name`
    (`proxy.PROXIES`), built (seconds) on first use, then reused."""
    folder = proxy_target_dir(cache_dir, name, seed)

    def build(tmp: Path) -> dict[str, Any]:
        return build_proxy_target(tmp, name=name, seed=seed)

    return _ensure_built(folder, build, {"version": PROXY_VERSION, "variant": name,
                                         "seed": seed}, f"the proxy target {name}", "seconds",
                         rebuild)


def _ensure_built(folder: Path, build: Callable[[Path], dict[str, Any]], meta: dict[str, Any],
                  what: str, takes: str, rebuild: bool) -> tuple[Path, dict[str, Any], bool]:
    """Build into a temporary folder beside `folder`, write the completion marker, rename into
    place; a valid marker means the folder is reused as it is (and nothing is logged). A build
    is logged at INFO before it starts: `what` is built into `folder`, which `takes` long."""
    marker = None if rebuild else read_complete_marker(folder)
    if marker is not None:
        return folder, marker["metrics"], True
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(folder.parent / f".{folder.name}"):  # one builder at a time per key
        # another process may have finished meanwhile
        marker = None if rebuild else read_complete_marker(folder)
        if marker is not None:
            return folder, marker["metrics"], True
        if folder.exists() and not rebuild:
            log.warning("cached %s in %s is incomplete or damaged; rebuilding it", what, folder)
        # We hold the lock, so temporary folders of this key belong to killed builders.
        for stale in folder.parent.glob(f".{folder.name}.*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
        try:
            log.info("building %s into %s (%s, once)", what, folder, takes)
            metrics = {**build(tmp), "folder": str(folder)}
            files = {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            atomic_write_json(tmp / MARKER, {**meta, "files": files, "metrics": metrics})
            if folder.exists():  # a damaged folder, or the old build when rebuilding
                old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
                os.replace(folder, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder, metrics, False
