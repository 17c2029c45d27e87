"""What the frozen target tells the draft about one training sequence (prompt + answer).

The target adapter's prefill of the prompt and one verify of the answer give, for every
position, the target's hidden states at the requested layers and its last (post-norm) hidden
state, which the LM head turns into the target's next-token distribution, and the visual-token
scores of the prefill (attention each visual token *receives* from the text in the last layer).
These are the very calls and tensors the draft sees while drafting.

`target_record` keeps them on the CPU in the dtype the target computed them in (what the
feature store writes); `sample_from_record` upcasts the features to the float32
`TargetSample` that training reads, so a sample from memory and one from the store are equal.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class TokenIdsReader(Protocol):
    """A sample sequence that reads one sample's `input_ids` without the rest of it (the
    feature store: the checkpoint fingerprint hashes every sample's ids)."""

    def input_ids(self, index: int) -> Tensor: ...


def sample_input_ids(samples: Sequence[TargetSample]) -> Iterator[Tensor]:
    """(seq,) int64 ids of each sample in order, read alone where the sequence allows."""
    if isinstance(samples, TokenIdsReader):
        return (samples.input_ids(i) for i in range(len(samples)))
    return (s.input_ids for s in samples)


@torch.no_grad()
def target_record(target: TargetAdapter, prompt_inputs: Mapping[str, Tensor], answer_ids: Tensor,
                  memory_layers: Sequence[int], distill_layers: Sequence[int]
                  ) -> dict[str, Tensor]:
    """Prefill the prompt and verify the answer through the target adapter, exactly as the
    speculative loop does, and keep what training needs, on the CPU in the dtype the target
    produced it (the feature store writes these; `sample_from_record` upcasts them).

    prompt_inputs: the processor's batch-1 inputs for the prompt (input_ids, pixel_values, ...)
    answer_ids:    (answer,) the target's own answer tokens
    Keys: input_ids (seq,) int64, prompt_len (1,) int64, visual_mask bool (prompt,),
    visual_scores float32 (prompt,), memory.<layer> (prompt, hidden), distill.<layer>
    (seq, hidden), last (seq, hidden).
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

    def cpu(x: Tensor) -> Tensor:  # a normal (not inference-mode) CPU copy, dtype kept
        return x.detach().cpu().clone().contiguous()

    record = {
        "input_ids": cpu(torch.cat((prompt_ids, answer_ids.to(prompt_ids.device)))).long(),
        "prompt_len": torch.tensor([prompt_len], dtype=torch.long, device="cpu"),
        "visual_mask": visual_mask,
        "visual_scores": scores,
        "last": cpu(torch.cat(last)),
    }
    record.update({f"memory.{i}": cpu(hidden[i][0]) for i in memory_layers})
    record.update({f"distill.{i}": cpu(torch.cat(hidden[i])) for i in distill_layers})
    return record


def upcast(x: Tensor) -> Tensor:
    """A float32 copy (a feature as training reads it, whatever dtype it was kept in)."""
    return x.to(torch.float32, copy=True)


def sample_from_record(record: Mapping[str, Tensor], memory_layers: Sequence[int],
                       distill_layers: Sequence[int]) -> TargetSample:
    """The `TargetSample` of a `target_record`: its features upcast to float32."""
    return TargetSample(
        input_ids=record["input_ids"],
        prompt_len=int(record["prompt_len"][0]),
        visual_mask=record["visual_mask"],
        visual_scores=record["visual_scores"],
        memory_hidden={i: upcast(record[f"memory.{i}"]) for i in memory_layers},
        distill_hidden={i: upcast(record[f"distill.{i}"]) for i in distill_layers},
        last_hidden=upcast(record["last"]),
    )


def collect_sample(target: TargetAdapter, prompt_inputs: Mapping[str, Tensor], answer_ids: Tensor,
                   memory_layers: Sequence[int], distill_layers: Sequence[int]) -> TargetSample:
    """One sequence's `TargetSample`, in memory (`target_record`, upcast to float32)."""
    record = target_record(target, prompt_inputs, answer_ids, memory_layers, distill_layers)
    return sample_from_record(record, memory_layers, distill_layers)
