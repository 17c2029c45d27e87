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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

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


def entropy_sum(attn: Tensor, query_mask: Tensor | None = None) -> tuple[float, int]:
    """Sum of attention-row entropies and the number of rows summed.

    attn:       (batch, heads, queries, keys) attention probabilities (rows sum to 1)
    query_mask: bool (batch, queries) True at real query positions (None: all)
    """
    p = attn.float().clamp_min(0)
    ent = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)  # (batch, heads, queries)
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


@torch.no_grad()
def measure_target_entropy(model: Any, batches: Iterable[dict[str, Tensor]],
                           query_masks: Iterable[Tensor | None] | None = None) -> list[float]:
    """Run a Hugging Face model with eager attention over `batches` and return AE per layer.

    The model's attention implementation is switched to "eager" for the measurement (sdpa
    returns no probabilities) and restored afterwards.
    """
    text_cfg = getattr(model.config, "text_config", None) or model.config
    meter = EntropyMeter(int(text_cfg.num_hidden_layers))
    previous = getattr(text_cfg, "_attn_implementation", None)
    model.set_attn_implementation("eager")
    try:
        masks = iter(query_masks) if query_masks is not None else None
        for batch in batches:
            out = model(**batch, output_attentions=True, use_cache=False)
            mask = next(masks) if masks is not None else batch.get("attention_mask")
            meter.add(out.attentions, None if mask is None else mask.bool())
    finally:
        if previous is not None:
            model.set_attn_implementation(previous)
    return meter.mean()
