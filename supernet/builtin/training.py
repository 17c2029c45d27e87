"""Training and evaluation of the built-in target on the synthetic tasks (used by `build`).

Sequences are exactly what inference sees: the processor's chat template with the image first
(``<s>USER: <image>*36 question ASSISTANT:``) followed by the answer and ``</s>``; the loss covers
the answer tokens only. Exact match is computed teacher-forced: greedy decoding reproduces the
reference answer (and stops) exactly when the argmax at every answer position is the reference
token, so one batched forward pass gives the same verdict as `generate` at a fraction of the cost
(a test checks the two agree).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from dreams_nas.supernet.core.dist import SINGLE, World
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.data.synth import CELL, IMAGE_SIZE, SynthSample, make_sample
from PIL import Image

IGNORE = -100


@dataclass(frozen=True)
class TargetTrainConfig:
    """Optimisation settings of one built-in target variant."""

    max_steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 50
    n_val: int = 96
    target_exact_match: float = 0.98  # stop early once the validation set reaches this
    min_lr_ratio: float = 0.1
    # Tasks of consecutive training samples, cycled (a task listed twice is drawn twice as
    # often); None: every task equally often. Validation always uses every task equally.
    task_mix: tuple[str, ...] | None = None
    # > 0: add this times an auxiliary per-cell loss on the image tokens (see `CellPatterns`).
    cell_aux_weight: float = 0.0


@dataclass(frozen=True)
class TargetBatch:
    input_ids: torch.Tensor  # (batch, seq) right-padded
    attention_mask: torch.Tensor  # (batch, seq)
    pixel_values: torch.Tensor  # (batch, 3, H, W)
    labels: torch.Tensor  # (batch, seq) answer tokens + EOS, IGNORE elsewhere


class Encoder:
    """Turns synthetic samples into training batches with the checkpoint's own processor."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self._prompt_ids: dict[str, list[int]] = {}

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of the templated question with the image tokens expanded by the processor."""
        if prompt not in self._prompt_ids:
            messages = [{"role": "user", "content": [{"type": "image"},
                                                     {"type": "text", "text": prompt}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True,
                                                      tokenize=False)
            blank = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE))
            ids = self.processor(images=[blank], text=[text])["input_ids"][0]
            self._prompt_ids[prompt] = list(ids)
        return self._prompt_ids[prompt]

    def answer_ids(self, answer: str) -> list[int]:
        return self.tokenizer(answer, add_special_tokens=False)["input_ids"] + [
            self.tokenizer.eos_token_id]

    def encode(self, samples: Sequence[SynthSample]) -> TargetBatch:
        rows = [(self.prompt_ids(s.prompt), self.answer_ids(s.answer)) for s in samples]
        length = max(len(p) + len(a) for p, a in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (p, a) in enumerate(rows):
            n = len(p) + len(a)
            input_ids[i, :n] = torch.tensor(p + a)
            labels[i, len(p):n] = torch.tensor(a)
            mask[i, :n] = 1
        pixels = self.processor.image_processor(images=[s.image for s in samples],
                                                return_tensors="pt")["pixel_values"]
        return TargetBatch(input_ids=input_ids, attention_mask=mask, pixel_values=pixels,
                           labels=labels)


class CellPatterns:
    """The distinct cell images of the synthetic tasks, as targets of an auxiliary loss.

    Every object, glyph and bar segment fills whole ``CELL`` x ``CELL`` cells drawn without
    anti-aliasing, so the training images are made of a small set of exact cell patterns (109:
    the shapes in every colour and size, the glyphs, the bars' coloured value labels, bar
    bodies and caps, the background).
    `labels` gives each cell of a batch its pattern's index; a linear head on the image tokens
    that the language model reads (the projector's output) is trained to predict it, next to the
    answer loss. The answers alone teach the vision side only through the few answer tokens
    that name what a cell holds ("small circle" vs "small square" differ in four pixels); the
    auxiliary loss supervises all 36 cells of every image and makes their content linearly
    readable early. The head is discarded after training: the saved model is a plain LLaVA.
    """

    def __init__(self, encoder: Encoder, samples: Sequence[SynthSample]) -> None:
        pixels = encoder.processor.image_processor(images=[s.image for s in samples],
                                                   return_tensors="pt")["pixel_values"]
        self.patterns = torch.unique(self._cells(pixels), dim=0)  # (P, 3*CELL*CELL), sorted

    @staticmethod
    def _cells(pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, 3, H, W) -> (batch * cells, 3 * CELL * CELL), cells row-major."""
        b, c, h, w = pixel_values.shape
        grid_h, grid_w = h // CELL, w // CELL
        cells = pixel_values.reshape(b, c, grid_h, CELL, grid_w, CELL).permute(0, 2, 4, 1, 3, 5)
        return cells.reshape(b * grid_h * grid_w, c * CELL * CELL)

    def __len__(self) -> int:
        return int(self.patterns.shape[0])

    def labels(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(batch, 3, H, W) -> (batch, cells) pattern index; IGNORE for a cell seen nowhere."""
        cells = self._cells(pixel_values)
        dist = torch.cdist(cells, self.patterns,  # (batch*cells, P), exact (no matmul form)
                           compute_mode="donot_use_mm_for_euclid_dist")
        best, index = dist.min(dim=1)
        index[best > 1e-3] = IGNORE
        return index.view(pixel_values.shape[0], -1)


def answer_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(summed next-token cross-entropy over the answer positions, how many there are), so
    that data-parallel ranks can divide by the global count.

    logits: (batch, seq, vocab) predicting the token after each position; labels: (batch, seq).
    """
    target = labels[:, 1:].reshape(-1)
    total = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), target, ignore_index=IGNORE,
        reduction="sum")
    return total, int((target != IGNORE).sum())


@torch.no_grad()
def exact_match_flags(model: Any, batch: TargetBatch) -> torch.Tensor:
    """(batch,) bool: greedy decoding would reproduce each reference answer exactly."""
    was_training = model.training
    model.eval()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   pixel_values=batch.pixel_values).logits
    model.train(was_training)
    pred = logits[:, :-1].argmax(-1)  # (batch, seq-1)
    target = batch.labels[:, 1:]
    ok = (pred == target) | (target == IGNORE)
    return ok.all(dim=1)


def exact_match(model: Any, encoder: Encoder, samples: Sequence[SynthSample],
                batch_size: int = 64) -> float:
    return exact_match_hits(model, encoder, samples, batch_size) / max(1, len(samples))


def exact_match_hits(model: Any, encoder: Encoder, samples: Sequence[SynthSample],
                     batch_size: int = 64) -> int:
    """How many of `samples` greedy decoding answers exactly."""
    hits = 0
    for start in range(0, len(samples), batch_size):
        hits += int(exact_match_flags(model, encoder.encode(samples[start:start + batch_size]))
                    .sum())
    return hits


def lr_at(step: int, cfg: TargetTrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    scale = (cfg.min_lr_ratio
             + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
    return cfg.lr * scale


def train_target(
    model: Any,
    encoder: Encoder,
    cfg: TargetTrainConfig,
    *,
    data_seed: int,
    on_step: Callable[[int, float, float | None], None] | None = None,
    sample_offset: int = 0,
    world: World = SINGLE,
) -> dict[str, Any]:
    """Train on fresh synthetic train samples until validation exact match or `max_steps`.

    Step ``s`` uses train samples ``offset + s*batch .. offset + (s+1)*batch - 1`` of dataset
    seed `data_seed` (`sample_offset` lets a second phase continue on unseen samples);
    validation uses train-split indices far beyond any step's, so it never overlaps training
    data and never touches the eval split. The loop draws no random numbers (no dropout, data
    order is a function of the step), so a run is reproducible from the initial weights alone.
    Returns the loss curve and the validation history.

    Data parallel over `world` (every rank holding the same weights): rank ``r`` of ``n`` takes
    the ``r``-th contiguous ``batch/n`` of each step's samples and of the validation set; each
    loss is divided by its count over the whole global batch, and the gradients are summed over
    the ranks, so a step is the one-process step up to float rounding and the ranks stay in
    step (same gradients, same clipping, same update, same stop).
    """
    if cfg.batch_size % world.size:
        raise InputError(f"batch size {cfg.batch_size} does not split over {world.size} ranks; "
                         "pick a rank count that divides it")
    per_rank = cfg.batch_size // world.size
    val_samples = [make_sample("train", data_seed, 10_000_000 + i) for i in range(cfg.n_val)]
    my_val = val_samples[world.rank * len(val_samples) // world.size:
                         (world.rank + 1) * len(val_samples) // world.size]
    params = list(model.parameters())
    aux = _CellAux(model, encoder, cfg, data_seed, sample_offset) if cfg.cell_aux_weight else None
    if aux is not None:
        params += list(aux.head.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.98))
    model.train()
    curve: list[dict[str, float]] = []
    history: list[dict[str, float]] = []
    step = 0
    for step in range(cfg.max_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        first = sample_offset + step * cfg.batch_size + world.rank * per_rank
        samples = [make_sample("train", data_seed, first + i,
                               *(() if cfg.task_mix is None else (cfg.task_mix,)))
                   for i in range(per_rank)]
        batch = encoder.encode(samples)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       pixel_values=batch.pixel_values).logits
        answer, n_answer = answer_loss_sum(logits, batch.labels)
        cells, n_cells = aux.loss_sum(batch.pixel_values) if aux is not None else (None, 0)
        n_answer, n_cells = world.sum([n_answer, n_cells])
        # Divided by the global counts and multiplied by the rank count, which the gradient
        # average divides out again: the summed gradient of the global batch's mean loss.
        loss = answer * world.size / max(1.0, n_answer)
        if cells is not None:
            loss = loss + cfg.cell_aux_weight * cells * world.size / max(1.0, n_cells)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        world.average(params)
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        global_loss = world.sum([float(loss.detach())])[0] / world.size
        curve.append({"step": step, "loss": global_loss})
        val = None
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
            hits = world.sum([exact_match_hits(model, encoder, my_val)])[0]
            val = hits / max(1, len(val_samples))
            history.append({"step": step, "val_exact_match": val})
        if on_step is not None:
            on_step(step, curve[-1]["loss"], val)
        if val is not None and val >= cfg.target_exact_match:
            break
    model.eval()
    if aux is not None:
        aux.close()
    return {"steps": step + 1, "loss_curve": curve, "val_history": history}


class _CellAux:
    """The auxiliary per-cell loss of `train_target`: a linear head on the projector's output."""

    def __init__(self, model: Any, encoder: Encoder, cfg: TargetTrainConfig, data_seed: int,
                 sample_offset: int) -> None:
        # The patterns come from the first training samples (512 hold all 109 of the tasks).
        first = [make_sample("train", data_seed, sample_offset + i,
                             *(() if cfg.task_mix is None else (cfg.task_mix,)))
                 for i in range(512)]
        self.patterns = CellPatterns(encoder, first)
        projector = model.model.multi_modal_projector
        hidden = projector.linear_2.out_features
        with torch.random.fork_rng(devices=[]):  # keep the global RNG untouched
            torch.manual_seed(data_seed + 7)
            self.head = torch.nn.Linear(hidden, len(self.patterns))
        self._features: list[torch.Tensor] = []
        self._handle = projector.register_forward_hook(
            lambda _m, _i, out: self._features.append(out))

    def loss_sum(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(summed cross-entropy over the batch's known cells, how many there are)."""
        features = self._features[-1]  # (batch, cells, hidden): the image tokens the LM reads
        self._features.clear()
        labels = self.patterns.labels(pixel_values).reshape(-1)  # (batch * cells,)
        logits = self.head(features.reshape(-1, features.shape[-1]))
        total = torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE,
                                                  reduction="sum")
        return total, int((labels != IGNORE).sum())

    def close(self) -> None:
        self._handle.remove()
        self._features.clear()
