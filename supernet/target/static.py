"""The target's decoding steps over a static KV cache, compiled once per shape.

    steps = StaticSteps(model, decoder, lm_head, compiled=True, mrope=False)
    cache = steps.fresh(prompt_len + reserve)     # before the prefill: reused, reset, or grown
    logits, hidden, layers = steps.chain(tokens, layers=(4,))    # k tokens after the cache
    logits, hidden, layers = steps.tree(tokens, layout, layers=(4,))  # a token tree's nodes

The cache is Hugging Face's `StaticCache` built with a full `StaticLayer` for every decoder
layer, sliding-window ones included (as the dynamic path keeps every position: a rejected draft
must roll back, which a rolling window cannot). Its buffers are written in place at the cache's
own length, a 0-d tensor on the device; a rollback moves that length and copies nothing; a
tree's accepted path is compacted in place (`compact_static`). Every step is a function of
fixed-shape tensors only: positions, the causal or tree mask and the requested layers' hidden
states are made inside the step from the cache's length, so the same compiled graph serves every
cycle of every request of that width, and a step of a new width compiles once. Compiling uses
`torch.compile` (mode ``reduce-overhead`` on CUDA, which captures CUDA graphs; inductor on the
CPU, with its C++ wrapper: `compile_options`); uncompiled, the same functions run eagerly
(`--compile off` on a static cache).

The hidden states of the requested layers come from forward hooks on every decoder layer,
registered at the first step and kept (a hook added or removed later would change what every
compiled graph guards on); a compiled graph returns the ones its step asks for, no copies.
`warmup_s` records the seconds each shape's first call took: its compilation.

A compiled step's later calls skip dynamo's guards (`warm_call`): with the tiny models of the
CPU and a GPU's launch-bound steps, checking a few thousand guards on every call (the model's
modules, the cache's layers, the hooks) cost as much as the step itself. Only a call like one
met before -- the same step on the same cache object, every tensor input of the same shape,
strides, dtype and device, the same grad mode (`signature`) -- skips them; anything else is
checked in full and compiles where it must (and were a warm call's graph missing, dynamo
raises rather than run another).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from dreams_nas.supernet.target.hooks import layer_hooks
from torch import Tensor, nn

log = logging.getLogger(__name__)

# How the target's decoding steps run (`TargetAdapter.use_steps`).
STEP_MODES = ("dynamic", "static", "compiled")

# torch.compile's backend for compiled steps where the caller names none (default: inductor):
# `eager` captures the same graphs without generating code, for tests and debugging.
BACKEND_ENV = "DREAMS_NAS_COMPILE_BACKEND"

# Compiled graphs one step function may hold (dynamo keeps them per code object, and every
# model, width and subnet of one process shares `StaticSteps._make`'s or the draft's static
# step): far above dynamo's default of 8.
RECOMPILE_LIMIT = 256

# A cache's capacity is rounded up to a multiple of this: the mask's width is a shape of the
# compiled steps, so capacities that differ by a few positions must not each compile.
CAPACITY_STEP = 256


def capacity_for(positions: int) -> int:
    """The capacity a request of `positions` positions gets: the next multiple of
    CAPACITY_STEP (at least one step)."""
    return max(1, -(-positions // CAPACITY_STEP)) * CAPACITY_STEP


def static_cache(config: Any, capacity: int) -> Any:
    """A `StaticCache` of `capacity` positions whose every layer keeps every position."""
    from transformers import StaticCache
    from transformers.cache_utils import Cache, StaticLayer

    layers = int(config.get_text_config(decoder=True).num_hidden_layers)
    cache = StaticCache.__new__(StaticCache)  # StaticCache's own init makes sliding layers
    Cache.__init__(cache, layers=[StaticLayer(max_cache_len=capacity) for _ in range(layers)])
    return cache


def cache_length(cache: Any) -> Tensor:
    """The positions a static cache holds, as its first layer's 0-d length tensor."""
    return cache.layers[0].cumulative_length


def compact_static(cache: Any, start: int, keep: Tensor) -> None:
    """`tree_attention.compact_cache` for a static cache: the entries at `keep` (absolute,
    ascending) written in place at ``start``, and every layer's length set to the end."""
    end = start + len(keep)
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        index = keep.to(layer.keys.device)
        target = torch.arange(start, end, device=index.device)
        for states in (layer.keys, layer.values):
            states.index_copy_(2, target, states.index_select(2, index))
        layer.cumulative_length.fill_(end)


def warm_call(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` for a compiled function already called with inputs like these (same
    shapes, same objects, same grad mode): dynamo evaluates only the guards that tell its
    compiled graphs apart (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`), not the
    full set that its first call was checked against."""
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        return fn(*args)


def signature(*args: Any) -> tuple:
    """What a compiled step's guards check of its arguments and the global state, as a key of
    the calls met (`warm_call`): each tensor's shape, strides, dtype, device, whether it is an
    inference tensor (its dispatch keys) and needs a gradient (a view's strides are its
    base's: a tree level's mask has its tree's), any other object itself (by identity), the
    grad and inference modes."""
    return (torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
            *((a.shape, a.stride(), a.dtype, a.device, a.is_inference(), a.requires_grad)
              if isinstance(a, Tensor) else id(a) for a in args))


def compile_backend(backend: str | None = None) -> str | None:
    """`backend`, else $DREAMS_NAS_COMPILE_BACKEND (said once in the log: its timings are not
    inductor's), else None: inductor."""
    if backend:
        return backend
    chosen = os.environ.get(BACKEND_ENV) or None
    if chosen and chosen not in _SAID:
        _SAID.add(chosen)
        log.warning("warning: compiled steps use torch.compile's %r backend (%s), not inductor",
                    chosen, BACKEND_ENV)
    return chosen


_SAID: set[str] = set()


def compile_step(fn: Callable[..., Any], backend: str | None,
                 device: torch.device) -> Callable[..., Any]:
    """`fn` compiled as every decoding step is: one fixed-shape graph per shape (no dynamic
    shapes, no graph break), `backend` (None: inductor, CUDA graphs on CUDA, its C++ wrapper
    on the CPU), and room for the many graphs one step function holds (`RECOMPILE_LIMIT`)."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit,
                                             4 * RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=False, fullgraph=True, **compile_settings(backend, device))


def compile_settings(backend: str | None, device: torch.device) -> dict[str, Any]:
    """torch.compile's `backend`, `mode` and `options` for a step on `device`: a named backend
    as it is; inductor (None) with CUDA graphs on CUDA, else with `compile_options`."""
    mode = None if backend else compile_mode(device)
    return {"backend": backend or "inductor", "mode": mode,
            "options": None if backend or mode else compile_options(device)}


def compile_mode(device: torch.device) -> str | None:
    """`torch.compile`'s mode for `device`: CUDA graphs on CUDA, plain inductor elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def compile_options(device: torch.device) -> dict[str, Any] | None:
    """Inductor's options where no mode is set (the CPU): its C++ wrapper, which calls the
    graph's kernels from C++ instead of a generated Python function. A compiled step of a small
    model is mostly that call sequence: at the built-in target's size it makes the decode step
    23 % faster and a draft step 25 % (BENCHMARKS.md, 'Compiled steps'). CUDA graphs replay
    without either wrapper."""
    return None if device.type == "cuda" else {"cpp_wrapper": True}


class StaticSteps:
    """The target's decode, verify and tree-verify steps over one reused static cache."""

    def __init__(self, model: nn.Module, decoder: nn.Module, lm_head: nn.Module, *,
                 compiled: bool, mrope: bool, backend: str | None = None) -> None:
        self.model, self.decoder, self.lm_head = model, decoder, lm_head
        self.compiled, self.mrope = compiled, mrope
        self.backend = compile_backend(backend) if compiled else backend
        self.cache: Any = None
        self.length = 0  # positions the cache holds, on the host (the device has its own)
        self.rope_deltas: Tensor | None = None  # set by `started`, before any step
        self.floor = 0  # positions a fresh cache holds at least (one capacity for a batch)
        self.warmup_s: dict[str, float] = {}  # the first call of each shape: its compilation
        self._steps: dict[tuple, Callable[..., tuple]] = {}
        self._warm: set[tuple] = set()  # compiled steps met on this cache: `warm_call`
        self._store: dict[int, Tensor] = {}
        self._hooked: dict[int, Any] = {}  # layer -> its hook's handle (every layer's)

    @property
    def capacity(self) -> int:
        return 0 if self.cache is None else int(self.cache.layers[0].max_cache_len)

    def fresh(self, positions: int) -> Any:
        """The cache for a request of up to `positions` positions, emptied: the one in use when
        it is large enough, else a new one (whose larger mask compiles each width once more).
        At least `floor` positions."""
        positions = max(positions, self.floor)
        if self.cache is not None and self.capacity >= positions:
            self.cache.reset()
        else:
            self.cache = static_cache(self.model.config, capacity_for(positions))
            self._warm.clear()  # every step sees a new cache: its guards are checked again
        self.length = 0
        return self.cache

    def started(self, length: int, rope_deltas: Tensor | None) -> None:
        """After the prefill: what the cache holds and (M-RoPE) the prompt's position deltas."""
        self.length = length
        # a step's input, made once a request (zeros where the model has none), not per step
        self.rope_deltas = (self.lm_head.weight.new_zeros(1, dtype=torch.long)
                            if rope_deltas is None
                            else rope_deltas.view(-1)[:1].to(self.lm_head.weight.device).clone())

    def _room(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise RuntimeError(
                f"a step of {n} positions after {self.length} cached passes the static cache's "
                f"{self.capacity}; reserve at least max_new_tokens + the widest verify at prefill")

    # ----------------------------------------------------------------- steps
    def chain(self, tokens: Tensor, layers: Sequence[int]) -> tuple[Tensor, Tensor, dict]:
        """k tokens (1, k) after the cache, causally: (float logits, hidden, layer hidden)."""
        return self._run("chain", tokens, layers, None, None)

    def tree(self, tokens: Tensor, levels: Tensor, bias: Tensor,
             layers: Sequence[int]) -> tuple[Tensor, Tensor, dict]:
        """A tree's n nodes (1, n) after the cache: node i at position length + levels[i],
        seeing the cache and the nodes where bias (n, n) is 0."""
        return self._run("tree", tokens, layers, levels, bias)

    def _run(self, kind: str, tokens: Tensor, layers: Sequence[int], levels: Tensor | None,
             bias: Tensor | None) -> tuple[Tensor, Tensor, dict]:
        n = tokens.shape[1]
        self._room(n)
        key = (kind, n, tuple(layers))
        fn = self._step(key, tuple(layers), tree=kind == "tree")
        args = (tokens, self.rope_deltas, levels, bias)
        warm = (key, id(self.cache), signature(*args)) if self.compiled else None
        if warm is not None and warm in self._warm:
            logits, hidden, picked = warm_call(fn, *args)
        else:
            logits, hidden, picked = fn(*args)
            if warm is not None:
                self._warm.add(warm)
        self.length += n
        return logits, hidden, dict(zip(layers, picked, strict=True))

    @torch.inference_mode()  # the cache was made in a prefill: its tensors are inference's
    def rollback(self, n: int) -> None:
        self.cache.crop(-n)
        self.length -= n

    @torch.inference_mode()
    def compact(self, start: int, keep: Tensor) -> None:
        compact_static(self.cache, start, keep)
        self.length = start + len(keep)

    def _step(self, key: tuple, layers: tuple[int, ...], tree: bool) -> Callable[..., tuple]:
        fn = self._steps.get(key)
        if fn is not None:
            return fn
        self._hook(layers)
        raw = self._make(layers, tree)
        if self.compiled:
            raw = compile_step(raw, self.backend, self.lm_head.weight.device)
        label = f"{key[0]}{key[1]}"

        def first(*args: Tensor) -> tuple:
            start = time.perf_counter()
            out = raw(*args)
            if self.compiled:
                self.warmup_s[label] = time.perf_counter() - start
            self._steps[key] = raw
            return out

        return first

    def _make(self, layers: tuple[int, ...], tree: bool) -> Callable[..., tuple]:
        model, lm_head, store, mrope = self.model, self.lm_head, self._store, self.mrope
        last = len(self.decoder.layers)

        def step(tokens: Tensor, deltas: Tensor, levels: Tensor | None,
                 bias: Tensor | None) -> tuple:
            cache = self.cache
            start = cache_length(cache)
            k = tokens.shape[1]
            mask = None
            if tree:
                assert levels is not None and bias is not None
                positions = (levels + start)[None]
                mask = tree_mask(bias, start, cache.layers[0].max_cache_len)
            else:
                positions = (torch.arange(k, device=tokens.device) + start)[None]
            if mrope:
                positions = (positions + deltas.view(1, 1))[None].expand(3, 1, k)
            out = model.model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                              cache=cache, use_cache=True)
            hidden = out.last_hidden_state
            picked = tuple(hidden if i == last else store[i] for i in layers)
            return lm_head(hidden).float(), hidden, picked

        return step

    def _hook(self, layers: tuple[int, ...]) -> None:
        """Hooks keeping every decoder layer's hidden state, registered at the first step and
        never removed: a hook added later (another drafter's layer) would change what every
        compiled graph guards on, and each would compile again. The store holds every layer's
        key from the start for the same reason (an empty one would fill after the first
        graph and fail its guard)."""
        if not self._hooked:
            wanted = range(len(self.decoder.layers))
            self._store.update({i: self.lm_head.weight.new_empty(0) for i in wanted})
            self._hooked = dict(zip(wanted, layer_hooks(self.decoder.layers, wanted,
                                                        self._store), strict=True))

    def close(self) -> None:
        """Remove the hooks (the model decodes as before) and drop the cache and the steps."""
        for handle in self._hooked.values():
            handle.remove()
        self._hooked.clear()
        self._steps.clear()
        self._warm.clear()
        self.cache = None


def tree_mask(bias: Tensor, start: Tensor, capacity: int) -> Tensor:
    """(B, 1, n, capacity) additive: every node sees the cache's first `start` positions, the
    nodes where `bias` (n, n) is 0 (placed at start..start+n) and nothing after. `start`: 0-d
    (one request, B = 1) or (B,), each row's own (`rows.RowSteps.tree`)."""
    n = bias.shape[0]
    starts = start.reshape(-1)
    cols = torch.arange(capacity, device=bias.device)
    rel = cols[None] - starts[:, None]  # (B, capacity): the column's node, where 0 <= rel < n
    inside = (rel >= 0) & (rel < n)
    nodes = bias[None].expand(rel.shape[0], -1, -1).gather(
        2, rel.clamp(0, n - 1)[:, None, :].expand(-1, n, -1))  # (B, n, capacity)
    blocked = torch.finfo(bias.dtype).min
    before = torch.where(rel < 0, 0.0, blocked).to(bias.dtype)[:, None, :].expand(-1, n, -1)
    return torch.where(inside[:, None, :], nodes, before)[:, None]
