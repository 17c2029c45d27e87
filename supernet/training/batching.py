"""Pad target samples into training batches and compute the three loss terms for one subnet."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import DraftOutput
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.unroll import unrolled_forward
from torch import Tensor

# weight of the k-th unrolled drafting pass (EAGLE-3 weighs its test-time steps by 0.8^k)
UNROLL_DECAY = 0.8


@dataclass
class DraftBatch:
    """Right-padded tensors. A row (`text_*`) holds the text positions, or every position
    (`collate(..., with_visual=True)`, for a draft whose own sequence keeps visual tokens:
    `DreamDraft.draft_positions` over `seq_visual`/`seq_scores` says which, per subnet)."""

    text_ids: Tensor  # (batch, text) token x_p
    text_pos: Tensor  # (batch, text) position p in the target's sequence
    text_mask: Tensor  # bool (batch, text)
    prev_hidden: Tensor  # (batch, text, hidden) target last hidden H_{p-1} (zeros at p = 0)
    last_hidden: Tensor  # (batch, text, hidden) H_p: the feature target and the KL's logits
    distill: dict[int, Tensor]  # layer -> (batch, text, hidden) target feature at p
    loss_mask: Tensor  # bool (batch, text): positions whose next token is an answer token
    memory_hidden: dict[int, Tensor]  # layer -> (batch, prompt, hidden)
    visual_mask: Tensor  # bool (batch, prompt)
    visual_scores: Tensor  # (batch, prompt)
    prompt_mask: Tensor  # bool (batch, prompt)
    seq_visual: Tensor  # bool (batch, text): visual-token positions of the rows
    seq_scores: Tensor  # (batch, text): their scores (`visual_scores` at those positions)

    @property
    def first_counted(self) -> int:
        """The first position (over the rows) whose prediction counts (`loss_mask`): the
        prompt's last; drafting passes start there (`unrolled_forward`'s `start`)."""
        counted = self.loss_mask.any(dim=1)
        if not bool(counted.any()):
            return int(self.loss_mask.shape[1])
        return int(self.loss_mask.to(torch.int8).argmax(dim=1)[counted].min())

    def keys(self, model: DreamDraft) -> Tensor:
        """bool (batch, text): the positions the active subnet's own sequence holds (its
        attention keys): the real text positions and the visual ones it keeps."""
        return model.draft_positions(self.seq_visual, self.seq_scores, self.text_mask)

    def to(self, device: torch.device | str) -> DraftBatch:
        def mv(x: Tensor) -> Tensor:
            return x.to(device)

        return DraftBatch(mv(self.text_ids), mv(self.text_pos), mv(self.text_mask),
                     mv(self.prev_hidden), mv(self.last_hidden),
                     {k: mv(v) for k, v in self.distill.items()}, mv(self.loss_mask),
                     {k: mv(v) for k, v in self.memory_hidden.items()}, mv(self.visual_mask),
                     mv(self.visual_scores), mv(self.prompt_mask), mv(self.seq_visual),
                     mv(self.seq_scores))


def collate(samples: Sequence[TargetSample], with_visual: bool = False) -> DraftBatch:
    """Pad `samples` into a batch whose rows hold their text positions, or every position
    when `with_visual` (`DraftConfig.visual_in_self`)."""
    b = len(samples)
    hidden = samples[0].last_hidden.shape[-1]
    texts = [s.sequence_positions(with_visual) for s in samples]
    t_max = max(int(t.numel()) for t in texts)
    p_max = max(s.prompt_len for s in samples)
    device = samples[0].last_hidden.device  # padded where the samples are (the CPU as collected)
    text_ids = torch.zeros(b, t_max, dtype=torch.long, device=device)
    text_pos = torch.zeros(b, t_max, dtype=torch.long, device=device)
    text_mask = torch.zeros(b, t_max, dtype=torch.bool, device=device)
    prev = torch.zeros(b, t_max, hidden, device=device)
    last = torch.zeros(b, t_max, hidden, device=device)
    loss_mask = torch.zeros(b, t_max, dtype=torch.bool, device=device)
    distill = {k: torch.zeros(b, t_max, hidden, device=device) for k in samples[0].distill_hidden}
    memory = {k: torch.zeros(b, p_max, hidden, device=device) for k in samples[0].memory_hidden}
    visual_mask = torch.zeros(b, p_max, dtype=torch.bool, device=device)
    scores = torch.zeros(b, p_max, device=device)
    prompt_mask = torch.zeros(b, p_max, dtype=torch.bool, device=device)
    seq_visual = torch.zeros(b, t_max, dtype=torch.bool, device=device)
    seq_scores = torch.zeros(b, t_max, device=device)
    for i, (s, pos) in enumerate(zip(samples, texts, strict=True)):
        n, seq = int(pos.numel()), int(s.input_ids.shape[0])
        text_ids[i, :n] = s.input_ids[pos]
        text_pos[i, :n] = pos
        text_mask[i, :n] = True
        shifted = torch.cat((s.last_hidden.new_zeros(1, hidden), s.last_hidden[:-1]))  # H_{p-1}
        prev[i, :n] = shifted[pos]
        last[i, :n] = s.last_hidden[pos]
        loss_mask[i, :n] = (pos >= s.prompt_len - 1) & (pos <= seq - 2)
        for k, v in s.distill_hidden.items():
            distill[k][i, :n] = v[pos]
        p = s.prompt_len
        for k, v in s.memory_hidden.items():
            memory[k][i, :p] = v
        visual_mask[i, :p] = s.visual_mask
        scores[i, :p] = s.visual_scores
        prompt_mask[i, :p] = True
        seq_visual[i, :n] = s.seq_visual[pos]
        seq_scores[i, :n] = torch.cat((s.visual_scores, s.visual_scores.new_zeros(
            seq - p)))[pos]
    return DraftBatch(text_ids, text_pos, text_mask, prev, last, distill, loss_mask, memory,
                 visual_mask, scores, prompt_mask, seq_visual, seq_scores)


@dataclass(frozen=True)
class LossWeights:
    kl: float = 1.0
    distill: float = 0.2
    feat: float = 0.2


@dataclass(frozen=True)
class LossSetup:
    """How `loss_terms` scores a subnet, the same on every step of a run.

    distill_layers: the target layers whose features supervise the cross block (AIFD); ()
            for none.
    weights: the weights of the three terms.
    unroll: extra passes in which the draft reads its own features, as drafting steps 2..
            (`unroll.unrolled_forward`); pass k's terms weigh UNROLL_DECAY**k (EAGLE-3's
            training-time test), normalised over the passes used, so the first drafted
            position, which every cycle drafts, keeps the most weight however deep the unroll.
    noise:  std of Gaussian noise added to the input features (EAGLE-style robustness to the
            draft's own, imperfect features while drafting), drawn per row (`row_noise`).
    """

    distill_layers: Sequence[int] = ()
    weights: LossWeights = field(default_factory=LossWeights)
    unroll: int = 0
    noise: float = 0.0


@dataclass(frozen=True)
class Teacher:
    """In-place distillation: per pass, the largest subnet's log-probabilities at the counted
    positions (`loss_terms(..., keep_logp=True)`, detached). The KL term becomes
    (1 - weight) KL(target || draft) + weight KL(teacher || draft)."""

    logp: list[Tensor]
    weight: float


@dataclass(frozen=True)
class GlobalBatch:
    """Data parallel: the batch is one of `replicas` slices of a global batch whose counted
    positions per pass are `counts` (`counted_positions` summed over the slices). Each term is
    then this slice's share of the global batch's mean, times `replicas`, so that the mean over
    the slices (what the ranks average) is the global batch's loss."""

    counts: Sequence[float]
    replicas: int


def _rms(x: Tensor) -> Tensor:
    # Residual streams of different depths differ in scale; compare directions per token.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def row_noise(batch: DraftBatch, seeds: Sequence[int]) -> Tensor:
    """Standard normal noise shaped as `batch.prev_hidden`, on its device: row i drawn from its
    own generator on that device, seeded `seeds[i]`, over that row's real positions only (zeros
    on padding). A row's noise does not depend on the rows beside it or the padding, so a
    data-parallel rank's slice of a batch gets the same noise as the whole batch in one process;
    it is a function of the seed and the device (a GPU's generator draws other numbers than
    the CPU's), and nothing is copied from the host."""
    b, t, h = batch.prev_hidden.shape
    if len(seeds) != b:
        raise ValueError(f"{len(seeds)} noise seeds for a batch of {b} rows")
    device = batch.prev_hidden.device
    out = torch.zeros(b, t, h, device=device)
    for i, (seed, n) in enumerate(zip(seeds, batch.text_mask.sum(1).tolist(), strict=True)):
        gen = torch.Generator(device=device).manual_seed(int(seed))
        out[i, :n] = torch.randn(n, h, generator=gen, device=device)
    return out


def counted_positions(batch: DraftBatch, unroll: int) -> list[int]:
    """Per pass k = 0..unroll, the positions whose loss pass k counts (`loss_terms`)."""
    counts = []
    for k in range(unroll + 1):
        m = batch.loss_mask.clone()
        if k:
            m[:, k:] &= batch.loss_mask[:, :-k]
            m[:, :k] = False
        counts.append(int(m.sum()))
    return counts


def loss_terms(model: DreamDraft, batch: DraftBatch, spec: SubnetSpec, setup: LossSetup, *,
               noise_seeds: Sequence[int] | None = None, teacher: Teacher | None = None,
               keep_logp: bool = False, global_batch: GlobalBatch | None = None
               ) -> dict[str, Tensor]:
    """KL(target || draft), SmoothL1(cross block, AIFD feature), SmoothL1(feature, last hidden)
    of subnet `spec` on `batch`, weighed and summed under "loss".

    noise_seeds: one seed per row for `setup.noise` (None: a seed from torch's global
    generator per row); teacher: in-place distillation (`Teacher`); keep_logp: also return,
    under "logp", this subnet's detached log-probabilities per pass (a later subnet's
    `Teacher`); global_batch: this batch is a data-parallel slice (`GlobalBatch`); None: the
    whole batch."""
    with model.using(spec):
        outs = _forward_passes(model, batch, spec, setup, noise_seeds)
    totals = {"kl": 0.0, "distill": 0.0, "feat": 0.0}
    used = 0.0
    kept: list[Tensor] = []
    for k, out in enumerate(outs):
        # pass k at text index t is the k-th drafted step of a cycle whose true context ends at
        # t - k: count it only when that start also lies in the answer
        m = batch.loss_mask.clone()
        if k:
            m[:, k:] &= batch.loss_mask[:, :-k]
            m[:, :k] = False
        w = UNROLL_DECAY**k
        if global_batch is not None and global_batch.counts[k] > 0:
            used += w  # the global batch counts this pass, whether this slice does or not
        if not bool(m.any()):
            continue
        if global_batch is None:
            used += w
        else:  # this slice's share of the global mean (times the replicas DDP averages over)
            w = w * global_batch.replicas * int(m.sum()) / float(global_batch.counts[k])
        feature = out.feature[m]  # (n, hidden)
        target = batch.last_hidden[m]
        draft_logp = F.log_softmax(model.logits(feature).float(), -1)
        target_logp = F.log_softmax(model.logits(target).float(), -1)
        kl = F.kl_div(draft_logp, target_logp, log_target=True, reduction="batchmean")
        if teacher is not None and teacher.weight > 0:
            kl = (1 - teacher.weight) * kl + teacher.weight * F.kl_div(
                draft_logp, teacher.logp[len(kept)], log_target=True, reduction="batchmean")
        if keep_logp or teacher is not None:
            kept.append(draft_logp.detach())
        totals["kl"] = totals["kl"] + w * kl
        totals["feat"] = totals["feat"] + w * F.smooth_l1_loss(feature, target)
        if out.cross_out is not None and setup.distill_layers and setup.weights.distill > 0:
            cross = _rms(out.cross_out[m])
            totals["distill"] = totals["distill"] + w * torch.stack(
                [F.smooth_l1_loss(cross, _rms(batch.distill[i][m]))
                 for i in setup.distill_layers]).mean()
    zero = batch.prev_hidden.new_zeros(())
    terms = {key: (val / used if used else zero) + zero for key, val in totals.items()}
    weights = setup.weights
    terms["loss"] = (weights.kl * terms["kl"] + weights.distill * terms["distill"]
                     + weights.feat * terms["feat"])
    if keep_logp:
        terms["logp"] = kept  # type: ignore[assignment]
    return terms


def _forward_passes(model: DreamDraft, batch: DraftBatch, spec: SubnetSpec, setup: LossSetup,
                    noise_seeds: Sequence[int] | None) -> list[DraftOutput]:
    """The active subnet's teacher-forced pass over `batch` (its input features noised by
    `setup.noise`), then `setup.unroll` passes on its own features."""
    memory = model.memory(batch.memory_hidden[spec.inject_layer], batch.visual_mask,
                          batch.visual_scores, batch.prompt_mask)
    prev = batch.prev_hidden
    if setup.noise > 0:
        seeds = (noise_seeds if noise_seeds is not None else
                 torch.randint(2**62, (prev.shape[0],), device="cpu").tolist())  # cpu: seeds
        prev = prev + setup.noise * row_noise(batch, seeds).to(dtype=prev.dtype)
    keys = batch.keys(model)
    if setup.unroll > 0:
        return unrolled_forward(model, batch.text_ids, prev, batch.text_pos, memory, keys,
                                setup.unroll, start=batch.first_counted)
    return [model(batch.text_ids, prev, batch.text_pos, memory, attention_mask=keys)]
