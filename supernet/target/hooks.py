"""Forward hooks that keep the hidden states of chosen decoder layers (HF ``hidden_states``
indexing: 0 the input embeddings, i >= 1 the output of decoder layer i; the last, the
final-normed state, is the decoder's own output and needs no hook)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn


def hook_layer(layers: nn.ModuleList, i: int, store: dict[int, Tensor]) -> Any:
    """A hook writing layer `i`'s hidden state (1 <= i < len(layers), or 0) into `store[i]`
    at every forward; returns its handle."""
    if i == 0:
        def pre(_mod, args, kwargs):
            store[0] = args[0] if args else kwargs["hidden_states"]
        return layers[0].register_forward_pre_hook(pre, with_kwargs=True)

    def post(_mod, _args, output, _i=i):
        store[_i] = output[0] if isinstance(output, tuple) else output
    return layers[i - 1].register_forward_hook(post)


def layer_hooks(layers: nn.ModuleList, wanted: Sequence[int], store: dict[int, Tensor]
                ) -> list[Any]:
    """Hooks for every layer in `wanted` but the last (ValueError outside 0..len(layers))."""
    handles = []
    for i in dict.fromkeys(wanted):
        if not 0 <= i <= len(layers):
            raise ValueError(f"layer {i} is outside 0..{len(layers)} (HF hidden_states indexing)")
        if i < len(layers):
            handles.append(hook_layer(layers, i, store))
    return handles
