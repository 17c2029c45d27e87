"""Self-distillation data: the target answers the training prompts itself, then its features.

The draft learns to predict what *this* target says, so its training answers are the target's
own greedy responses to the training prompts (the dataset's reference answers are not used).
They are cached in the run folder (`self_distilled_answers`: a resumed run does not regenerate
them), and a prompt's processor inputs, pixels included, are built only when a pass reads them
(`PromptInputs`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import torch
from dreams_nas.supernet.core.digests import files_sha256
from dreams_nas.supernet.core.dist import current
from dreams_nas.supernet.core.io import atomic_write_json, read_json
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.aifd import AifdResult, aifd_from_entropy, measure_target_entropy
from dreams_nas.supernet.training.features import TargetSample, collect_sample
from torch import Tensor

_BATCHABLE = {"input_ids", "attention_mask", "pixel_values"}
ANSWER_BATCH = 8  # prompts the target answers in one left-padded batch


def _left_pad(prompts: Sequence[Mapping[str, Tensor]], pad_id: int) -> dict[str, Tensor]:
    width = max(int(p["input_ids"].shape[1]) for p in prompts)
    ids, mask = [], []
    for p in prompts:
        n = int(p["input_ids"].shape[1])
        pad = torch.full((1, width - n), pad_id, dtype=p["input_ids"].dtype, device="cpu")
        ids.append(torch.cat((pad, p["input_ids"].cpu()), 1))
        mask.append(torch.cat((torch.zeros(1, width - n, dtype=torch.long, device="cpu"),
                               torch.ones(1, n, dtype=torch.long, device="cpu")), 1))
    out = {"input_ids": torch.cat(ids), "attention_mask": torch.cat(mask)}
    if "pixel_values" in prompts[0]:
        out["pixel_values"] = torch.cat([p["pixel_values"].cpu() for p in prompts])
    return out


def _eos_ids(model: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        text_cfg = getattr(model.config, "text_config", None) or model.config
        eos = getattr(text_cfg, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


@torch.no_grad()
def regenerate_answers(model: Any, prompts: Sequence[Mapping[str, Tensor]], max_new_tokens: int,
                       batch_size: int = 8, show_progress: bool | None = None) -> list[Tensor]:
    """The target's greedy answer to each prompt (ids, ending with EOS when it stopped).

    `prompts` are read `batch_size` at a time (a lazy sequence builds only those: the pixels of
    all prompts are never held at once). A chunk whose prompts hold only input_ids /
    attention_mask / pixel_values is generated as one left-padded batch; others (e.g.
    Qwen-VL's grid inputs) one prompt at a time.
    """
    device = next(model.parameters()).device
    eos = _eos_ids(model)
    text_cfg = getattr(model.config, "text_config", None) or model.config
    pad = getattr(model.generation_config, "pad_token_id", None)
    pad = pad if pad is not None else getattr(text_cfg, "pad_token_id", None)
    pad = int(pad if pad is not None else (min(eos) if eos else 0))
    # A placeholder token in an answer would be read as an image slot when the answer is fed
    # back with the prompt's pixels; such an answer is cut before it.
    image_ids = {int(v) for v in (getattr(model.config, "image_token_id", None),
                                  getattr(model.config, "image_token_index", None))
                 if v is not None}
    answers: list[Tensor] = []
    bar = progress(total=len(prompts), desc="self-distillation answers", unit="prompt",
                   disable=show_progress is False or None)
    for start in range(0, len(prompts), batch_size):
        chunk = [prompts[i] for i in range(start, min(start + batch_size, len(prompts)))]
        batchable = all(set(p) <= _BATCHABLE for p in chunk)
        for part in [chunk] if batchable else [[p] for p in chunk]:
            inputs = _left_pad(part, pad) if batchable else dict(part[0])
            inputs = {k: v.to(device) for k, v in inputs.items()}
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad)
            new = out[:, inputs["input_ids"].shape[1]:].cpu()
            del inputs, out
            for row in new:
                ids = row.tolist()
                stop = next((i for i, t in enumerate(ids) if t in eos), None)
                ids = ids[: stop + 1] if stop is not None else ids
                cut = next((i for i, t in enumerate(ids) if t in image_ids), None)
                ids = ids[:cut] if cut is not None else ids
                answers.append(torch.tensor(ids, dtype=torch.long, device="cpu"))
        bar.update(len(chunk))
        del chunk, part  # this chunk's pixels go before the next chunk's are built
    bar.close()
    return answers


def measure_aifd(model: Any, prompts: Sequence[Mapping[str, Tensor]], answers: Sequence[Tensor],
                 k: int = 1) -> AifdResult:
    """AE / dAE per target layer over prompt + answer sequences, and the AIFD choice.

    The answer is appended by the adapter's `extend_inputs`, so every per-token input grows with
    `input_ids` (Qwen-VL's `mm_token_type_ids` too, which M-RoPE reads at full length).
    """
    device = next(model.parameters()).device
    extend = TargetAdapter.from_model(model).extend_inputs
    # a generator: one calibration batch on the device at a time
    batches = (extend({key: v.to(device) if isinstance(v, Tensor) else v
                       for key, v in prompt.items()}, answer.view(1, -1))
               for prompt, answer in zip(prompts, answers, strict=True))
    return aifd_from_entropy(measure_target_entropy(model, batches), k)


def collect_samples(target: TargetAdapter, prompts: Sequence[Mapping[str, Tensor]],
                    answers: Sequence[Tensor], memory_layers: Sequence[int],
                    distill_layers: Sequence[int], show_progress: bool | None = None
                    ) -> list[TargetSample]:
    samples = []
    bar = progress(total=len(prompts), desc="target features", unit="prompt",
                   disable=show_progress is False or None)
    for prompt, answer in zip(prompts, answers, strict=True):
        samples.append(collect_sample(target, prompt, answer, memory_layers, distill_layers))
        bar.update(1)
    bar.close()
    return samples


class PromptInputs(Sequence[dict[str, Tensor]]):
    """Chat-templated model inputs (image first) of each example's question, built by
    `target.build_inputs` when an item is read (and not kept: read it once per pass), so that
    the pixels of all prompts are never held at once; a slice is another lazy sequence."""

    def __init__(self, target: TargetAdapter, examples: Sequence[Any]) -> None:
        self.target = target
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    @overload
    def __getitem__(self, item: int) -> dict[str, Tensor]: ...

    @overload
    def __getitem__(self, item: slice) -> PromptInputs: ...

    def __getitem__(self, item: int | slice) -> dict[str, Tensor] | PromptInputs:
        if isinstance(item, slice):
            return PromptInputs(self.target, self.examples[item])
        example = self.examples[item]
        return self.target.build_inputs(example.image_path, example.prompt)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for i in range(len(self)):
            yield self[i]


def prompt_inputs(target: TargetAdapter, examples: Sequence[Any]) -> PromptInputs:
    """Chat-templated model inputs (image first) for each example's question, built lazily."""
    return PromptInputs(target, examples)


def answers_key(target: TargetAdapter, examples: Sequence[Any], max_new_tokens: int) -> str:
    """16 hex digits of what the target's answers depend on: the target, dtype, answer budget
    and each example (id, image content, prompt); the answers cache holds it beside the answers."""
    images = files_sha256(ex.image_path for ex in examples)
    digest = hashlib.sha256(json.dumps(
        {"target": str(target.path or target.target_id), "max_new_tokens": max_new_tokens,
         "dtype": str(target.dtype),
         "examples": [[str(ex.id), image, ex.prompt]
                      for ex, image in zip(examples, images, strict=True)]}
    ).encode())
    return digest.hexdigest()[:16]


def self_distilled_answers(target: TargetAdapter, prompts: Sequence[Mapping[str, Tensor]],
                           key: str, cache_file: Any, max_new_tokens: int,
                           show_progress: bool | None) -> list[Tensor]:
    """The target's own answers, cached in the run folder (a resumed run does not regenerate).

    Several ranks (`dist.current()`) split the prompts by chunks of `ANSWER_BATCH` (the batches
    one process generates, so each answer is generated in the same left-padded batch as it
    would be alone); each rank caches its part beside `cache_file` until rank 0 has written
    the merged file."""
    world = current()
    cached = _cached_answers(cache_file, key)
    if cached is not None:
        return cached
    if not world.distributed:
        answers = regenerate_answers(target.model, prompts, max_new_tokens,
                                     batch_size=ANSWER_BATCH, show_progress=show_progress)
    else:
        chunks = [range(i, min(i + ANSWER_BATCH, len(prompts)))
                  for i in range(0, len(prompts), ANSWER_BATCH)]
        part = None if cache_file is None else Path(cache_file).with_name(
            f"{Path(cache_file).stem}.rank{world.rank}of{world.size}.json")
        mine = _cached_answers(part, key)
        if mine is None:
            rows = [i for c in world.mine(chunks) for i in c]
            mine = regenerate_answers(target.model, [prompts[i] for i in rows], max_new_tokens,
                                      batch_size=ANSWER_BATCH, show_progress=show_progress)
            if part is not None:
                atomic_write_json(part, {"key": key, "answers": [a.tolist() for a in mine]})
        parts = world.gather([a.tolist() for a in mine])
        by_chunk = [parts[j % world.size] for j in range(len(chunks))]
        offsets = [0] * world.size
        answers = []
        for j, chunk in enumerate(chunks):
            r = j % world.size
            got = by_chunk[j][offsets[r]: offsets[r] + len(chunk)]
            offsets[r] += len(chunk)
            answers += [torch.tensor(a, dtype=torch.long, device="cpu") for a in got]
    if cache_file is not None and world.is_main:
        atomic_write_json(cache_file, {"key": key, "answers": [a.tolist() for a in answers]})
        for stale in Path(cache_file).parent.glob(f"{Path(cache_file).stem}.rank*of*.json"):
            stale.unlink(missing_ok=True)
    return answers


def _cached_answers(cache_file: Any, key: str) -> list[Tensor] | None:
    if cache_file is None or not Path(cache_file).is_file():
        return None
    data = read_json(cache_file)
    if isinstance(data, dict) and data.get("key") == key:
        return [torch.tensor(a, dtype=torch.long, device="cpu") for a in data["answers"]]
    return None
