"""The names `--target` accepts besides a checkpoint folder or a hub id (no torch here).

``builtin`` is the trained built-in target; the ``proxy-*`` names are the real-shaped,
random-weight proxy targets (`supernet.builtin.proxy`). A run whose target is one of them records
the name, so a later command rebuilds the cached checkpoint when it is gone.
"""

from __future__ import annotations

BUILTIN = "builtin"
PROXY_TARGETS = ("proxy-llava", "proxy-llava-tiny")
NAMED_TARGETS = (BUILTIN, *PROXY_TARGETS)


def is_named_target(target: object) -> bool:
    """True for ``builtin`` and the proxy names."""
    return str(target) in NAMED_TARGETS
