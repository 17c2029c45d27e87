"""The kinds of step a profile times and a latency model prices (no torch): the one vocabulary
that `latency.measure` (what is timed) and `latency.model` (what is fitted) share.

* ``draft``: one hot draft step of a subnet (over `k` nodes: a token tree's level);
  ``draft_first``: the cycle's first draft step, right after the target's verify.
* ``decode``: one plain target step (k = 1); ``verify``: the target over k = draft_len + 1
  positions; ``verify_tree``: over a token tree's nodes and its root.
* ``cycle`` / ``cycle_tree``: the speculative cycle's own work outside the forwards, per k.
"""

from __future__ import annotations

from dreams_nas.supernet.core.spec import ARCH_FIELDS

KINDS = ("draft", "draft_first", "decode", "verify", "verify_tree", "cycle", "cycle_tree")
DRAFT_KINDS = ("draft", "draft_first")  # keyed by a spec
TARGET_KINDS = ("decode", "verify", "verify_tree", "cycle", "cycle_tree")  # keyed by k
# The spec fields one draft step's cost depends on (not inject_layer: every target layer has
# the target's width; not draft_len: that is how many steps a cycle takes).
DRAFT_AXES = tuple(f for f in ARCH_FIELDS if f != "inject_layer")
