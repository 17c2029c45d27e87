"""What a named target (`builtin`, `proxy-*`) is on disk: the stage that needs it resolves it here.

`TargetAdapter.load` loads a checkpoint folder or a hub id and nothing else; a command whose
`--target` is a name calls `resolve_target` first. A name resolves to its cached checkpoint
folder (`cache`), built on first use -- minutes of training for the built-in target, seconds
for a proxy -- and logged at INFO before the build starts; a cached one is returned at once,
without a word.
"""

from __future__ import annotations

from pathlib import Path

from dreams_nas.supernet.builtin.cache import (
    builtin_target_dir,
    ensure_builtin_target,
    ensure_proxy_target,
    proxy_target_dir,
)
from dreams_nas.supernet.builtin.variants import builtin_variant
from dreams_nas.supernet.core.targets import BUILTIN, is_named_target


def target_folder(target: str | Path) -> str | Path:
    """Where `target` is, without building anything: a named target's cache folder (which may
    not exist yet), any other `target` as it is."""
    if not is_named_target(target):
        return target
    if str(target) == BUILTIN:
        return builtin_target_dir(variant=builtin_variant())
    return proxy_target_dir(name=str(target))


def same_folder(a: str | Path, b: str | Path) -> bool:
    """Whether two spellings of a path name one folder (symlinks, relative parts resolved)."""
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def resolve_target(target: str | Path, *, show_progress: bool | None = None) -> str | Path:
    """The checkpoint folder (or hub id) to load for `target`: a named target's cached folder,
    built first when the cache lacks it (``builtin`` is the variant `builtin_variant` names);
    any other `target` as it is. show_progress: False hides the build's progress bar."""
    if not is_named_target(target):
        return target
    if str(target) == BUILTIN:
        return ensure_builtin_target(variant=builtin_variant(),
                                     progress=show_progress is not False)
    return ensure_proxy_target(str(target))[0]
