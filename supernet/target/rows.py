"""Several requests decoded at once over one static KV cache whose rows keep their own lengths.

    rows = RowSteps.of(adapter)              # the adapter's: eager, or compiled when it is
    rows.start(batch=4, positions=...)       # a pooled cache for 4 rows, every row empty
    pre = adapter.prefill(inputs, ...)       # one request alone, as at batch 1
    rows.admit(b, adapter, pre)              # ... copied into row b
    logits, hidden = rows.chain(tokens)      # (B, k) tokens, each row after its own length
    rows.keep(n, k)                          # (B,) on the device: row b keeps n_b + 1 of the k
    rows.select(index)                       # only these rows go on (a smaller batch)

A row's positions fill its buffer from slot 0 (the request's prompt, then what it generated:
slot i holds position i; shorter rows are padded on the right), so every slot below a row's
length is its own and nothing at or above it is seen: a step's mask is causal per row (within
the sliding window where the model has one), no padding is attended, and a rejected draft
leaves no hole (`keep` lowers that row's length; the next step overwrites the slots). A row's
arithmetic is its batch-1 arithmetic up to the order of floating-point sums in batched
products. Each request is prefilled alone (`TargetAdapter.prefill`, at batch 1: images of any
size and family need no collating) and its cache copied in (`admit`).

Every step is a function of fixed-shape tensors (the tokens, the rows' lengths and M-RoPE
deltas, all on the device), so one graph serves every cycle at one (batch, width); compiled,
as the adapter's own steps (`static`): once per shape, its later calls skipping the guards.
Caches are pooled per (batch, capacity): the compiled graphs keep their buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from dreams_nas.supernet.target.static import (
    capacity_for,
    compile_step,
    signature,
    tree_mask,
    warm_call,
)
from dreams_nas.supernet.target.tree_attention import sliding_window
from torch import Tensor


def _row_layer_class() -> type:
    from transformers.cache_utils import StaticLayer

    class RowLayer(StaticLayer):
        """A `StaticLayer` whose rows write their new positions after their own lengths (the
        cache's shared `lengths`, advanced by the step, not here)."""

        def __init__(self, max_cache_len: int, lengths: Tensor) -> None:
            super().__init__(max_cache_len)
            self.lengths = lengths

        def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
                   **kwargs: Any) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[-2]
            slots = self.lengths[:, None] + torch.arange(n, device=key_states.device)  # (B, n)
            for buffer, states in ((self.keys, key_states), (self.values, value_states)):
                index = slots[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
                buffer.scatter_(2, index, states)
            return self.keys, self.values

        def get_seq_length(self) -> Any:
            return self.lengths.max() if self.is_initialized else 0

    return RowLayer


_ROW_LAYER: type | None = None


class RowCache:
    """A static cache of `batch` rows and `capacity` positions; `lengths` (batch,) and
    `deltas` (batch,) (M-RoPE's position offset of each row's text, else 0) on the device."""

    def __init__(self, config: Any, batch: int, capacity: int, device: torch.device) -> None:
        global _ROW_LAYER
        from transformers import StaticCache
        from transformers.cache_utils import Cache

        _ROW_LAYER = _ROW_LAYER or _row_layer_class()
        self.batch, self.capacity = batch, capacity
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.deltas = torch.zeros(batch, dtype=torch.long, device=device)
        torch._dynamo.mark_static_address(self.lengths)
        torch._dynamo.mark_static_address(self.deltas)
        layers = int(config.get_text_config(decoder=True).num_hidden_layers)
        self.cache = StaticCache.__new__(StaticCache)
        Cache.__init__(self.cache, layers=[_ROW_LAYER(capacity, self.lengths)
                                           for _ in range(layers)])

    def admit(self, row: int, source: Any, length: int, delta: int) -> None:
        """Row `row` holds the first `length` positions of `source` (a batch-1 HF cache)."""
        for layer, src in zip(self.cache.layers, source.layers, strict=True):
            self._allocate(layer, src.keys, src.values)
            layer.keys[row, :, :length].copy_(src.keys[0, :, :length])
            layer.values[row, :, :length].copy_(src.values[0, :, :length])
        self.lengths[row] = length
        self.deltas[row] = delta

    def _allocate(self, layer: Any, keys: Tensor, values: Tensor) -> None:
        """`layer`'s buffers, (batch, heads, capacity, head_dim) like `keys` and `values`."""
        if not layer.is_initialized:
            layer.lazy_initialization(keys.new_zeros((self.batch, keys.shape[1], 1, keys.shape[3])),
                                      values.new_zeros((self.batch, values.shape[1], 1,
                                                        values.shape[3])))

    def take(self, source: RowCache, index: Tensor) -> None:
        """The rows `index` of `source`, in that order (as many as this cache holds)."""
        for layer, src in zip(self.cache.layers, source.cache.layers, strict=True):
            self._allocate(layer, src.keys, src.values)
            layer.keys.copy_(src.keys.index_select(0, index))
            layer.values.copy_(src.values.index_select(0, index))
        self.lengths.copy_(source.lengths.index_select(0, index))
        self.deltas.copy_(source.deltas.index_select(0, index))

    def reset(self) -> None:
        self.lengths.zero_()
        self.deltas.zero_()


def row_mask(starts: Tensor, k: int, capacity: int, window: int | None,
             dtype: torch.dtype) -> Tensor:
    """(B, 1, k, capacity) additive: query i of row b (at slot starts[b] + i) sees the slots up
    to its own (and, with a sliding `window`, none `window` or more before it)."""
    query = starts[:, None] + torch.arange(k, device=starts.device)  # (B, k)
    cols = torch.arange(capacity, device=starts.device)
    seen = cols[None, None] <= query[:, :, None]
    if window is not None:
        seen = seen & (cols[None, None] > query[:, :, None] - window)
    blocked = torch.finfo(dtype).min
    return torch.where(seen, 0.0, blocked).to(dtype)[:, None]


class RowSteps:
    """The target's batched chain step over pooled row caches, eager or compiled."""

    @classmethod
    def of(cls, adapter: Any) -> RowSteps:
        """The adapter's row steps, made on first use and kept on it (compiled when its own
        steps are; `TargetAdapter.use_steps` before this)."""
        static = adapter.static
        compiled = static is not None and static.compiled
        steps = getattr(adapter, "_rows", None)
        if not isinstance(steps, RowSteps) or steps.compiled != compiled:
            steps = RowSteps(adapter, compiled=compiled,
                             backend=None if static is None else static.backend)
            adapter._rows = steps
        return steps

    def __init__(self, adapter: Any, *, compiled: bool, backend: str | None = None) -> None:
        self.adapter = adapter
        self.model, self.lm_head = adapter.model, adapter.lm_head
        self.mrope = adapter.info.uses_mrope
        self.compiled, self.backend = compiled, backend
        config = adapter.decoder.config
        self.window = sliding_window(config)
        types = getattr(config, "layer_types", None) or ()
        # full and sliding layers side by side: each kind gets its own mask
        self.mixed = self.window is not None and "full_attention" in types
        self.rows: RowCache | None = None
        self.lengths: list[int] = []  # the host's count of each row's positions
        self.warmup_s: dict[str, float] = {}
        self._pool: dict[tuple[int, int], RowCache] = {}
        self._steps: dict[tuple[int, int], Callable[..., tuple[Tensor, Tensor]]] = {}
        self._warm: set[tuple] = set()

    @property
    def batch(self) -> int:
        return 0 if self.rows is None else self.rows.batch

    @property
    def capacity(self) -> int:
        return 0 if self.rows is None else self.rows.capacity

    @torch.inference_mode()  # the caches are made and written in inference mode
    def start(self, batch: int, positions: int) -> None:
        """An empty cache of `batch` rows, each for up to `positions` positions."""
        self.rows = self._cache(batch, capacity_for(positions))
        self.rows.reset()
        self.lengths = [0] * batch

    def _cache(self, batch: int, capacity: int) -> RowCache:
        key = (batch, capacity)
        if key not in self._pool:
            self._pool[key] = RowCache(self.model.config, batch, capacity,
                                       self.lm_head.weight.device)
        return self._pool[key]

    @torch.inference_mode()  # the caches are made and written in inference mode
    def admit(self, row: int, adapter: Any, prefill: Any) -> None:
        """Row `row` holds the request `adapter` has just prefilled (`prefill` its output)."""
        assert self.rows is not None, "start() first"
        length = int(prefill.input_ids.shape[1])
        if length > self.capacity:
            raise RuntimeError(f"a prompt of {length} positions passes the rows' capacity "
                               f"{self.capacity}; start() with room for the longest")
        delta = 0
        if self.mrope:
            deltas = getattr(adapter.model.model, "rope_deltas", None)
            delta = 0 if deltas is None else int(deltas.view(-1)[0])
        self.rows.admit(row, adapter.cache, length, delta)
        self.lengths[row] = length

    @torch.inference_mode()  # the caches are made and written in inference mode
    def select(self, index: list[int]) -> None:
        """Keep the rows `index` (in that order): a smaller batch from the next step on."""
        assert self.rows is not None
        if index == list(range(self.batch)):
            return
        smaller = self._cache(len(index), self.capacity)
        smaller.take(self.rows, torch.tensor(index, device=self.rows.lengths.device))
        self.rows = smaller
        self.lengths = [self.lengths[i] for i in index]

    def chain(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """k tokens (B, k) after each row's own positions: (float logits (B, k, vocab), the
        final-normed hidden states (B, k, hidden)). Every row's length grows by k."""
        return self._run(tokens, None, None)

    def tree(self, tokens: Tensor, levels: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """A token tree's n nodes (B, n) after each row's own positions, breadth first with
        node 0 the root: node i at position length + levels[i], seeing the row's cache and the
        nodes where bias (n, n) is 0 (`tree_attention.TreeLayout`); follow with `keep_paths`."""
        return self._run(tokens, levels, bias)

    def _run(self, tokens: Tensor, levels: Tensor | None, bias: Tensor | None
             ) -> tuple[Tensor, Tensor]:
        assert self.rows is not None, "start() first"
        batch, k = tokens.shape
        if max(self.lengths) + k > self.capacity:
            raise RuntimeError(f"a step of {k} positions after {max(self.lengths)} passes the "
                               f"rows' capacity {self.capacity}; start() with more positions")
        key = (batch, k, levels is not None)
        fn = self._step(key)
        args = (tokens, levels, bias)
        warm = (key, id(self.rows), signature(*args)) if self.compiled else None
        if warm is not None and warm in self._warm:
            out = warm_call(fn, *args)
        else:
            out = fn(*args)
            if warm is not None:
                self._warm.add(warm)
        self.lengths = [n + k for n in self.lengths]
        return out

    @torch.inference_mode()  # the caches are made and written in inference mode
    def keep_paths(self, index: Tensor, n: Tensor, k: int, counts: list[int]) -> None:
        """After a `tree` of k nodes: row b keeps the nodes index[b, :n[b] + 1] (its accepted
        root-to-node path; (B, depth + 1), padded past it), packed right after its length
        before the tree; n[b] = -1 keeps none. `counts` is n on the host."""
        assert self.rows is not None
        rows = self.rows
        start = rows.lengths - k  # (B,) each row's length before the tree
        source = start[:, None] + index  # (B, depth + 1) cache slots
        target = start[:, None] + torch.arange(index.shape[1], device=index.device)
        for layer in rows.cache.layers:
            for buffer in (layer.keys, layer.values):
                shape = (-1, buffer.shape[1], -1, buffer.shape[3])
                picked = buffer.gather(2, source[:, None, :, None].expand(*shape))
                buffer.scatter_(2, target[:, None, :, None].expand(*shape), picked)
        rows.lengths.copy_(start + n + 1)
        self.lengths = [length - k + c + 1 for length, c in zip(self.lengths, counts,
                                                                strict=True)]

    @torch.inference_mode()  # the caches are made and written in inference mode
    def keep(self, n: Tensor, k: int, counts: list[int]) -> None:
        """After a chain of k: row b keeps its first n[b] + 1 positions (n (B,) on the device,
        -1 keeps none); `counts` is the same on the host."""
        assert self.rows is not None
        self.rows.lengths.sub_(k - 1 - n)
        self.lengths = [length - (k - 1 - c) for length, c in zip(self.lengths, counts,
                                                                  strict=True)]

    def _step(self, key: tuple[int, int, bool]) -> Callable[..., tuple[Tensor, Tensor]]:
        fn = self._steps.get(key)
        if fn is not None:
            return fn
        raw = self._make(tree=key[2])
        if self.compiled:
            raw = compile_step(raw, self.backend, self.lm_head.weight.device)

        def first(*args: Tensor) -> tuple[Tensor, Tensor]:
            start = time.perf_counter()
            out = raw(*args)
            if self.compiled:
                name = f"rows{key[0]}x{'tree' if key[2] else ''}{key[1]}"
                self.warmup_s[name] = time.perf_counter() - start
            self._steps[key] = raw
            return out

        return first

    def _make(self, tree: bool) -> Callable[..., tuple[Tensor, Tensor]]:
        model, lm_head, mrope, window, mixed = (self.model, self.lm_head, self.mrope,
                                                self.window, self.mixed)

        def step(tokens: Tensor, levels: Tensor | None,
                 bias: Tensor | None) -> tuple[Tensor, Tensor]:
            rows = self.rows
            assert rows is not None
            k = tokens.shape[1]
            starts = rows.lengths
            dtype = lm_head.weight.dtype
            if tree:
                assert levels is not None and bias is not None
                positions = starts[:, None] + levels[None]  # (B, k)
                mask: Any = tree_mask(bias, starts, rows.capacity)
            else:
                positions = starts[:, None] + torch.arange(k, device=tokens.device)  # (B, k)
                mask = row_mask(starts, k, rows.capacity, None if mixed else window, dtype)
                if mixed:
                    mask = {"full_attention": mask, "sliding_attention": row_mask(
                        starts, k, rows.capacity, window, dtype)}
            if mrope:
                positions = (positions + rows.deltas[:, None])[None].expand(3, -1, -1)
            out = model.model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                              cache=rows.cache, use_cache=True)
            rows.lengths.add_(k)
            hidden = out.last_hidden_state
            return lm_head(hidden).float(), hidden

        return step
