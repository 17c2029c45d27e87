"""What the frozen target tells the draft about one training sequence (prompt + answer).

One eager forward pass over the whole sequence gives, for every position, the target's hidden
states at the requested layers and its last (post-norm) hidden state, which the LM head turns
into the target's next-token distribution; its last-layer attention gives the visual-token
scores (attention each visual token *receives* from the prompt's text positions, averaged over
heads — the rows of answer positions are left out, so the scores equal those of a prefill of
the prompt alone, which is what the draft sees at inference) and every layer's attention
entropy for AIFD.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .aifd import EntropyMeter


@dataclass(frozen=True)
class TargetSample:
    """Target-side tensors of one sequence (no batch dimension)."""

    input_ids: Tensor  # (seq,) prompt + answer
    prompt_len: int
    visual_mask: Tensor  # bool (prompt,)
    visual_scores: Tensor  # (prompt,) attention received from prompt text (0 at text positions)
    memory_hidden: dict[int, Tensor]  # inject layer -> (prompt, hidden)
    distill_hidden: dict[int, Tensor]  # AIFD layer -> (seq, hidden)
    last_hidden: Tensor  # (seq, hidden) post-norm: logits = lm_head(last_hidden)

    @property
    def text_positions(self) -> Tensor:
        """Positions the draft's self-attention runs over: everything but visual tokens."""
        seq = self.input_ids.shape[0]
        visual = torch.zeros(seq, dtype=torch.bool)
        visual[: self.prompt_len] = self.visual_mask
        return torch.nonzero(~visual, as_tuple=False).flatten()


def image_token_id(model: Any) -> int:
    cfg = model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(cfg, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(model).__name__} has no image_token_id in its config; "
                     "the draft needs to know which positions are visual tokens")


def visual_scores_from_attention(attn: Tensor, visual_mask: Tensor, prompt_len: int) -> Tensor:
    """attn: (heads, seq, seq) last-layer probabilities; visual_mask: bool (prompt,).

    Returns (prompt,): for each visual position k, sum over prompt text queries q of the
    head-averaged a[q, k]; 0 at text positions.
    """
    a = attn[:, :prompt_len, :prompt_len].float().mean(0)  # (prompt, prompt)
    text_rows = ~visual_mask
    received = a[text_rows].sum(0)
    return torch.where(visual_mask, received, torch.zeros_like(received))


@torch.no_grad()
def collect_sample(model: Any, prompt_inputs: Mapping[str, Tensor], answer_ids: Tensor,
                   memory_layers: Sequence[int], distill_layers: Sequence[int],
                   entropy: EntropyMeter | None = None) -> TargetSample:
    """Run the target (eager attention) once over prompt + answer.

    prompt_inputs: the processor's batch-1 inputs for the prompt (input_ids, pixel_values, ...)
    answer_ids:    (answer,) the target's own answer tokens
    """
    prompt_ids = prompt_inputs["input_ids"][0]
    prompt_len = int(prompt_ids.shape[0])
    device = prompt_ids.device
    ids = torch.cat((prompt_ids, answer_ids.to(device)))[None]
    inputs = {k: v for k, v in prompt_inputs.items() if k not in ("input_ids", "attention_mask")}
    text_cfg = getattr(model.config, "text_config", None) or model.config
    previous = getattr(text_cfg, "_attn_implementation", None)
    model.set_attn_implementation("eager")
    try:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs,
                    output_hidden_states=True, output_attentions=True, use_cache=False)
    finally:
        if previous is not None:
            model.set_attn_implementation(previous)
    hs = out.hidden_states
    visual_mask = (prompt_ids == image_token_id(model)).cpu()
    if entropy is not None:
        entropy.add([a.cpu() for a in out.attentions])
    scores = visual_scores_from_attention(out.attentions[-1][0].cpu(), visual_mask, prompt_len)
    return TargetSample(
        input_ids=ids[0].cpu(),
        prompt_len=prompt_len,
        visual_mask=visual_mask,
        visual_scores=scores,
        memory_hidden={int(lyr): hs[lyr][0, :prompt_len].float().cpu() for lyr in memory_layers},
        distill_hidden={int(lyr): hs[lyr][0].float().cpu() for lyr in distill_layers},
        last_hidden=hs[-1][0].float().cpu(),
    )
