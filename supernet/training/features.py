"""What the frozen target tells the draft about one training sequence (prompt + answer).

The target adapter's prefill of the prompt and one verify of the answer give, for every
position, the target's hidden states at the requested layers and its last (post-norm) hidden
state, which the LM head turns into the target's next-token distribution, and the visual-token
scores of the prefill (attention each visual token *receives* from the text in the last layer).
These are the very calls and tensors the draft sees while drafting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from dreams_nas.supernet.target.adapter import TargetAdapter
from torch import Tensor


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
    def seq_visual(self) -> Tensor:
        """bool (seq,): the visual-token positions of the whole sequence."""
        visual = self.visual_mask.new_zeros(self.input_ids.shape[0])  # bool, where the sample is
        visual[: self.prompt_len] = self.visual_mask
        return visual

    def sequence_positions(self, with_visual: bool) -> Tensor:
        """Positions a batch row holds: every one (`with_visual`: a draft whose own sequence
        may keep visual tokens; which it keeps is masked per subnet) or the text ones only."""
        if with_visual:
            return torch.arange(self.input_ids.shape[0], device=self.input_ids.device)
        return torch.nonzero(~self.seq_visual, as_tuple=False).flatten()

    def answer_index(self, with_visual: bool) -> int:
        """Index of the first answer token in the row of `sequence_positions(with_visual)`."""
        return self.prompt_len if with_visual else int((~self.visual_mask).sum())


@torch.no_grad()
def collect_sample(target: TargetAdapter, prompt_inputs: Mapping[str, Tensor], answer_ids: Tensor,
                   memory_layers: Sequence[int], distill_layers: Sequence[int]) -> TargetSample:
    """Prefill the prompt and verify the answer through the target adapter, exactly as the
    speculative loop does, and keep what training needs.

    prompt_inputs: the processor's batch-1 inputs for the prompt (input_ids, pixel_values, ...)
    answer_ids:    (answer,) the target's own answer tokens
    """
    layers = tuple(sorted(set(memory_layers) | set(distill_layers)))
    pre = target.prefill(dict(prompt_inputs), layers=layers)
    prompt_ids = pre.input_ids[0]
    prompt_len = int(prompt_ids.shape[0])
    hidden = {i: [pre.layer_hidden[i][0]] for i in layers}
    last = [pre.last_hidden[0]]
    if answer_ids.numel():
        out = target.verify(answer_ids.view(1, -1).to(target.device), layers=layers)
        for i in layers:
            hidden[i].append(out.layer_hidden[i][0])
        last.append(out.last_hidden[0])
    visual_mask = torch.zeros(prompt_len, dtype=torch.bool, device="cpu")  # a sample is on the CPU
    scores = torch.zeros(prompt_len, device="cpu")
    positions = pre.visual_positions.cpu()
    visual_mask[positions] = True
    scores[positions] = pre.visual_scores.float().cpu()

    def keep(x: Tensor) -> Tensor:  # a normal (not inference-mode) float32 CPU copy
        return x.detach().float().cpu().clone()

    return TargetSample(
        input_ids=keep(torch.cat((prompt_ids, answer_ids.to(prompt_ids.device)))).long(),
        prompt_len=prompt_len,
        visual_mask=visual_mask,
        visual_scores=scores,
        memory_hidden={i: keep(hidden[i][0]) for i in memory_layers},
        distill_hidden={i: keep(torch.cat(hidden[i])) for i in distill_layers},
        last_hidden=keep(torch.cat(last)),
    )
