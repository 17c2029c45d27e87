"""Adaptive intermediate feature distillation (AIFD): which target layer supervises the draft.

For every target layer l = 1..L we measure the mean attention entropy

    AE_l = mean over calibration prompts, heads and (real) query positions of
           -sum_k a[q, k] * log a[q, k]

and its change from the layer below, dAE_l = AE_l - AE_{l-1} (dAE_1 = 0). A layer with low AE
attends sharply (it has settled on what matters) and a layer with low |dAE| sits where the
representation has stopped changing, so its features are a stable, informative target for the
draft's cross-attention block.

Selection rule (exact): the candidates are layers 2..L-1 (layer 1 has no real dAE, layer L is
already the final-feature target; with L < 3 every layer is a candidate). Each candidate gets

    score_l = AE_l / max_c AE_c + |dAE_l| / max_c |dAE_c|

(a term whose maximum is 0 counts as 0), and the `k` candidates with the lowest scores are
chosen (ties: the shallower layer), returned in increasing layer order.

How AE is measured (`measure_target_entropy`): layer by layer, as the model runs. Asking the
model for ``output_attentions=True`` would hold every layer's (batch, heads, S, S) map at once,
O(L·H·S²): ~29 GB for a 13B LLaVA-NeXT at 3k tokens. Instead the text decoder's attention
implementation is switched, for the call only, to a function registered with transformers'
`AttentionInterface` under a name unique to the call. It runs the decoder family's own
`eager_attention_forward` (the one eager mode would run: same scaling, mask and any family
specific step) on query chunks of at most `chunk_elements` (batch × heads × chunk × keys) scores
(at least one query per chunk), adds each chunk's row entropies to that layer's running sum
(keyed by the module's ``layer_idx``) and returns the concatenated output, so the model computes
what eager computes and no map outlives its chunk. Softmax is per query row, so chunking over
queries changes nothing; the masks are eager's too (eager's mask function is registered under
the same name). On a CPU without native 16-bit products eager gets float32 copies of the
16-bit queries, keys and values (`supernet.ops.linear`: torch's 16-bit kernel is far slower
there) and its output is rounded back. Forward hooks were the alternative: an eager attention
module returns its weights to its layer, so a hook could reduce them, but only after the full
(batch, heads, S, S) map of that layer exists, unchunked.

Only the text config (``config.get_text_config()``, the object the decoder's attention modules
read) is switched; the vision tower keeps its own implementation, and every config of the text
subtree gets its own implementation back afterwards, also when the forward raises.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from dreams_nas.supernet.ops.linear import emulated_dtype
from torch import Tensor

# Scores per attention block (batch x heads x query chunk x keys): 32M, i.e. 128 MiB per float32
# copy; eager's softmax and the entropy make a few such copies. 13B LLaVA-NeXT (40 heads) at 3k
# tokens: chunks of ~280 queries.
DEFAULT_CHUNK_ELEMENTS = 1 << 25

RULE_TEXT = ("candidates l=2..L-1; score_l = AE_l/max(AE) + |dAE_l|/max|dAE| over the candidates; "
             "choose the k lowest scores (ties: shallower layer)")


@dataclass(frozen=True)
class AifdResult:
    layers: tuple[int, ...]  # 1..L
    ae: tuple[float, ...]
    delta_ae: tuple[float, ...]
    chosen: tuple[int, ...]
    rule: str = RULE_TEXT

    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "ae": list(self.ae), "delta_ae": list(self.delta_ae),
                "chosen": list(self.chosen), "rule": self.rule}


def _row_entropy(attn: Tensor) -> Tensor:
    """(batch, heads, queries, keys) probabilities -> (batch, heads, queries) float32 entropies."""
    p = attn.float().clamp_min(0)
    return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)


def entropy_sum(attn: Tensor, query_mask: Tensor | None = None) -> tuple[float, int]:
    """Sum of attention-row entropies and the number of rows summed.

    attn:       (batch, heads, queries, keys) attention probabilities (rows sum to 1)
    query_mask: bool (batch, queries) True at real query positions (None: all)
    """
    ent = _row_entropy(attn)  # (batch, heads, queries)
    if query_mask is None:
        return float(ent.sum()), int(ent.numel())
    m = query_mask[:, None, :].expand_as(ent)
    return float(ent[m].sum()), int(m.sum())


class EntropyMeter:
    """Accumulates per-layer mean attention entropy over calibration batches."""

    def __init__(self, num_layers: int) -> None:
        self.sums = [0.0] * num_layers
        self.counts = [0] * num_layers

    def add(self, attentions: Sequence[Tensor], query_mask: Tensor | None = None) -> None:
        """attentions: one (batch, heads, queries, keys) tensor per layer, layer 1 first."""
        if len(attentions) != len(self.sums):
            raise ValueError(f"got {len(attentions)} attention maps for {len(self.sums)} layers")
        for i, attn in enumerate(attentions):
            s, n = entropy_sum(attn, query_mask)
            self.sums[i] += s
            self.counts[i] += n

    def mean(self) -> list[float]:
        if not all(self.counts):
            raise ValueError("no attention rows were measured; "
                             "give at least one calibration prompt")
        return [s / n for s, n in zip(self.sums, self.counts, strict=True)]


def delta(ae: Sequence[float]) -> list[float]:
    return [0.0] + [float(ae[i] - ae[i - 1]) for i in range(1, len(ae))]


def choose_layers(ae: Sequence[float], k: int = 1) -> list[int]:
    """Apply the module's selection rule to per-layer AE (index 0 = layer 1); 1-based layers."""
    num = len(ae)
    if num == 0:
        raise ValueError("choose_layers needs the entropy of at least one layer")
    d = delta(ae)
    cands = list(range(2, num)) if num >= 3 else list(range(1, num + 1))
    k = max(1, min(k, len(cands)))
    max_ae = max(ae[c - 1] for c in cands)
    max_d = max(abs(d[c - 1]) for c in cands)

    def score(c: int) -> float:
        a = ae[c - 1] / max_ae if max_ae > 0 else 0.0
        b = abs(d[c - 1]) / max_d if max_d > 0 else 0.0
        return a + b

    ranked = sorted(cands, key=lambda c: (score(c), c))
    return sorted(ranked[:k])


def aifd_from_entropy(ae: Sequence[float], k: int = 1) -> AifdResult:
    return AifdResult(layers=tuple(range(1, len(ae) + 1)), ae=tuple(float(x) for x in ae),
                      delta_ae=tuple(delta(ae)), chosen=tuple(choose_layers(ae, k)))


class _LayerEntropy:
    """The attention function of one measurement and its per-layer (sum, count) of entropies.

    `attention` has the signature of transformers' attention functions; the sums of a batch stay
    on the layers' devices until `end_batch` adds them to the meter (one sync per layer).
    """

    def __init__(self, num_layers: int, chunk_elements: int) -> None:
        self.meter = EntropyMeter(num_layers)
        self.chunk_elements = chunk_elements
        self._query_mask: Tensor | None = None  # bool (batch, queries) of the current batch
        self._real_rows = 0  # True entries of _query_mask
        self._on_device: dict[torch.device, Tensor] = {}
        self._pending: dict[int, Tensor] = {}
        self._eager: dict[type, Callable[..., Any]] = {}

    def begin_batch(self, query_mask: Tensor | None) -> None:
        self._query_mask = None if query_mask is None else query_mask.bool()
        self._real_rows = 0 if query_mask is None else int(self._query_mask.sum())
        self._on_device = {}
        self._pending = {}

    def end_batch(self, model_name: str) -> None:
        missing = [i + 1 for i in range(len(self.meter.sums)) if i not in self._pending]
        if missing:
            raise RuntimeError(
                f"text layers {missing} of {model_name} never ran the entropy attention: its "
                "decoder does not read config.get_text_config()._attn_implementation, so AIFD "
                "cannot measure it")
        for layer, total in self._pending.items():
            self.meter.sums[layer] += float(total)

    def _eager_for(self, module: Any) -> Callable[..., Any]:
        """The `eager_attention_forward` of the module's modeling file: what eager would run."""
        cls = type(module)
        if cls not in self._eager:
            eager = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
            if eager is None:
                raise TypeError(f"{cls.__name__} ({cls.__module__}) has no "
                                "eager_attention_forward beside it; AIFD needs the eager "
                                "attention of the target's text decoder")
            self._eager[cls] = eager
        return self._eager[cls]

    def _mask_on(self, device: torch.device, batch: int, queries: int) -> Tensor | None:
        mask = self._query_mask
        if mask is None:
            return None
        if tuple(mask.shape) != (batch, queries):
            raise ValueError(f"query mask of shape {tuple(mask.shape)} does not match the "
                             f"attention's (batch, queries) = ({batch}, {queries}); give one "
                             "bool (batch, seq) mask per batch, seq = input_ids.shape[1]")
        if device not in self._on_device:
            self._on_device[device] = mask.to(device=device, dtype=torch.float32)
        return self._on_device[device]

    def attention(self, module: Any, query: Tensor, key: Tensor, value: Tensor,
                  attention_mask: Tensor | None, *args: Any, **kwargs: Any
                  ) -> tuple[Tensor, None]:
        """query (batch, heads, queries, head_dim), key/value (batch, kv_heads, keys, head_dim),
        attention_mask eager's additive (batch, 1, queries, keys) or None -> the output
        (batch, queries, heads, head_dim) and no weights."""
        layer = getattr(module, "layer_idx", None)
        if layer is None or not 0 <= layer < len(self.meter.sums):
            raise RuntimeError(f"{type(module).__name__} has layer_idx {layer!r}, outside the "
                               f"{len(self.meter.sums)} text layers of the config")
        eager = self._eager_for(module)
        dtype = query.dtype
        if emulated_dtype(query, key) is not None:  # no native 16-bit products: eager in float32
            query, key, value = query.float(), key.float(), value.float()
        batch, heads, queries = query.shape[:3]
        mask = self._mask_on(query.device, batch, queries)  # (batch, queries) 0/1 or None
        step = max(1, self.chunk_elements // max(1, batch * heads * key.shape[-2]))
        rows_masked = attention_mask is not None and attention_mask.shape[-2] == queries
        outputs = []
        total = query.new_zeros((), dtype=torch.float32)
        for start in range(0, queries, step):
            stop = min(start + step, queries)
            rows = attention_mask[..., start:stop, :] if rows_masked else attention_mask
            out, weights = eager(module, query[:, :, start:stop], key, value, rows,
                                 *args, **kwargs)
            ent = _row_entropy(weights)  # (batch, heads, chunk)
            if mask is not None:
                ent = ent * mask[:, None, start:stop]
            total = total + ent.sum()
            outputs.append(out)  # (batch, chunk, heads, head_dim)
        self._pending[layer] = self._pending.get(layer, 0) + total
        self.meter.counts[layer] += heads * (batch * queries if mask is None else self._real_rows)
        return torch.cat(outputs, dim=1).to(dtype), None


def _config_tree(config: Any) -> list[Any]:
    """`config` and its sub-configs at any depth, parents before children."""
    out, todo = [], [config]
    while todo:
        cfg = todo.pop(0)
        out.append(cfg)
        todo.extend(sub for key in getattr(cfg, "sub_configs", {})
                    if (sub := getattr(cfg, key, None)) is not None)
    return out


@contextmanager
def _text_attention(model: Any, function: Callable[..., Any]) -> Iterator[None]:
    """Run the text decoder's attention through `function` (with eager's masks) inside the
    block; every config of the text subtree gets its own implementation back afterwards."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    text_cfg = model.config.get_text_config()
    saved = [(cfg, cfg._attn_implementation) for cfg in _config_tree(text_cfg)]
    # unique per call, and free of "eager"/"sdpa"/"flash"/"flex", which transformers tests for
    name = f"dreams_aifd_entropy_{id(function):x}"
    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    try:
        text_cfg._attn_implementation = name
        yield
    finally:
        for cfg, implementation in saved:  # parents first: a child's own value wins
            cfg._attn_implementation = implementation
        # GeneralInterface has register() but no unregister
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)


@torch.no_grad()
def measure_target_entropy(model: Any, batches: Iterable[dict[str, Tensor]],
                           query_masks: Iterable[Tensor | None] | None = None, *,
                           chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> list[float]:
    """Run a Hugging Face model over `batches` and return AE per text layer (layer 1 first).

    Each layer's entropies are reduced while that layer runs, in query chunks of at most
    `chunk_elements` scores (module docstring); the model computes what eager attention
    computes. query_masks: one bool (batch, seq) per batch, True at the query positions that
    count (default: the batch's attention_mask; None or no mask: every position).
    """
    if int(chunk_elements) < 1:
        raise ValueError(f"chunk_elements={chunk_elements} must be a positive number of "
                         f"attention scores (default {DEFAULT_CHUNK_ELEMENTS})")
    text_cfg = model.config.get_text_config()
    sink = _LayerEntropy(int(text_cfg.num_hidden_layers), int(chunk_elements))
    with _text_attention(model, sink.attention):
        masks = iter(query_masks) if query_masks is not None else None
        for batch in batches:
            sink.begin_batch(next(masks) if masks is not None else batch.get("attention_mask"))
            model(**batch, use_cache=False)
            sink.end_batch(type(model).__name__)
    return sink.meter.mean()
