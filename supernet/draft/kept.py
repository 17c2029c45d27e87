"""The weights a draft keeps per subnet, and the check that they still view its parameters.

A kept subnet's weights are views of the draft's parameters: they follow in-place changes (an
optimizer step, a channel permutation) but not a parameter *replaced*: a module or parameter
assigned in its place (`load_state_dict(..., assign=True)` from any parent, `setattr`), a
submodule moved on its own (`.to`, `.half`), `param.data = ...`. `Kept.current` finds that out
before each use, in a few microseconds (C-level maps over flat tuples; a `parameters()` walk
would cost a third of a small draft's step): every module and parameter on the way is still
the one in its parent's `_modules` / `_parameters` entry, and every parameter the weights
slice still holds the same memory. A parameter the weights hold itself (a norm, the fuse, a
full-width MLP) follows `param.data = ...` without a check.

A memory address suffices: a view keeps its parameter's storage alive, so a replacing tensor
can have the same address only by being the same memory (the same tensors assigned again),
where the views are still right.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import getitem, is_
from typing import Any, NamedTuple

from torch import Tensor, nn


class Kept(NamedTuple):
    """A subnet's weights (an `ActiveWeights`) and where they were sliced from."""

    weights: Any
    homes: tuple[dict[str, Any], ...]  # the `_modules` / `_parameters` dict of each entry
    names: tuple[str, ...]
    held: tuple[Any, ...]  # the module or parameter each entry held when sliced
    sliced: tuple[Tensor, ...]  # the parameters the weights hold views of
    addresses: list[int]  # their `data_ptr()` when sliced

    def current(self) -> bool:
        """Whether every module and parameter the weights came from is still in its place and
        every sliced parameter still holds the same memory."""
        try:
            return (all(map(is_, map(getitem, self.homes, self.names), self.held))
                    and list(map(Tensor.data_ptr, self.sliced)) == self.addresses)
        except KeyError:  # a module or parameter deleted
            return False


def keep(weights: Any, paths: Iterable[tuple[nn.Module, str, bool]]) -> Kept:
    """`weights` and where they come from: each (parent, name, whole) names a submodule of
    `parent`; with `whole` every module and parameter below it is watched too."""
    homes: list[dict[str, Any]] = []
    names: list[str] = []
    held: list[Any] = []

    def watch(home: dict[str, Any], name: str, whole: bool) -> None:
        homes.append(home)
        names.append(name)
        held.append(home[name])
        if whole and isinstance(home[name], nn.Module):
            module = home[name]
            for key, param in module._parameters.items():
                if param is not None:
                    watch(module._parameters, key, False)
            for key, child in module._modules.items():
                if child is not None:
                    watch(module._modules, key, True)

    for parent, name, whole in paths:
        watch(parent._modules, name, whole)
    own = {id(t) for t in _tensors(weights) if isinstance(t, nn.Parameter)}
    sliced = tuple(p for p in held if isinstance(p, nn.Parameter) and id(p) not in own)
    return Kept(weights, tuple(homes), tuple(names), tuple(held), sliced,
                [p.data_ptr() for p in sliced])


def _tensors(weights: Any) -> Iterator[Tensor]:
    """Every tensor in `weights` (tuples of tensors and tuples, at any depth)."""
    for item in weights:
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, tuple):
            yield from _tensors(item)
