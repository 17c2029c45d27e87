"""Acceptance length tau of every subnet, teacher forced (temperature 0).

At temperature 0 the output of speculative decoding *is* the target's greedy output, so the
target is run once per prompt and every subnet and every draft length is scored against it:

1. `trace_target`: the target's greedy continuation y_0..y_{N-1} (decoded through the adapter
   as plain decoding does) with the last hidden state of every position, plus what a draft
   reads at prefill (the inject layers' hidden states over the prompt, visual-token scores).
2. `draft_ranks`: the draft rolled out from *every* start position at once (one batch row
   per start): at start t the draft's cache holds the prompt and y_0..y_{t-1} with the
   target's true features (as a drafter that refreshes its cache from the verified features
   after each cycle has), it reads (y_t, H_{t-1}) and then the target's tokens with its own
   features. The result is, per start and level, the rank of the target's token among the
   draft's: a chain accepts the leading levels where it is the argmax, a token tree
   (`supernet.core.tree`) those where it is within the tree's width at that level
   (`accepted_levels`), because at temperature 0 the path a tree accepts is the target's
   greedy continuation.
3. `simulate_cycles`: the speculative loop replayed on those accepted levels for one shape,
   with the engine's exact rules (the budget left before max_new_tokens, the bonus token, EOS),
   giving the cycle lengths a real run produces, hence tau for every chain and tree from one
   rollout.

Rows are pooled over prompts (tau = tokens / target verify forwards), with a bootstrap 95%
interval over prompts and per-position acceptance rates (accepted / offered at position i,
as `GenerationStats.accept_rates`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.cycles import accepted_levels, simulate_cycles
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.batching import collate
from dreams_nas.supernet.training.features import TargetSample
from dreams_nas.supernet.training.ranks import path_ranks
from torch import Tensor


@dataclass(frozen=True)
class TargetTrace:
    """The target's side of one prompt, shared by every subnet (CPU tensors, no batch dim)."""

    prompt_len: int
    tokens: Tensor  # (prompt_len + n_cont,) prompt ids then the greedy continuation
    last_hidden: Tensor  # (prompt_len + n_hidden, hidden) H_p (final-normed) for p < len
    layer_hidden: dict[int, Tensor]  # inject layer -> (prompt_len, hidden)
    visual_mask: Tensor  # bool (prompt_len,)
    visual_scores: Tensor  # (prompt_len,) attention received (0 at text positions)
    eos_index: int | None  # index in the continuation of the first EOS, None if none
    max_new_tokens: int

    @property
    def continuation(self) -> Tensor:
        return self.tokens[self.prompt_len:]

    @property
    def n_starts(self) -> int:
        """Cycles can start after y_t for t < n_starts (before EOS and the token budget)."""
        end = self.max_new_tokens - 1
        if self.eos_index is not None:
            end = min(end, self.eos_index)
        return max(0, end)


@torch.inference_mode()
def trace_target(adapter: TargetAdapter, inputs: Mapping[str, Tensor], layers: Sequence[int],
                 max_new_tokens: int, max_draft_len: int) -> TargetTrace:
    """Greedy-decode `max_new_tokens` (plus up to `max_draft_len` past an EOS: a real loop verifies
    draft tokens past it) and keep every position's last hidden state."""
    pre = adapter.prefill(dict(inputs), layers=tuple(layers))
    prompt_ids = pre.input_ids[0].cpu()
    prompt_len = int(prompt_ids.shape[0])
    token = pre.logits.reshape(-1, pre.logits.shape[-1])[-1].argmax().view(1, 1)
    tokens, hidden = [int(token)], [pre.last_hidden[0].float().cpu()]
    eos = adapter.eos_token_ids
    eos_index = 0 if tokens[0] in eos else None
    limit = max_new_tokens if eos_index is None else min(max_new_tokens, max_draft_len + 1)
    while len(tokens) < limit:
        out = adapter.verify(token)
        hidden.append(out.last_hidden[0].float().cpu())
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
        if eos_index is None and tokens[-1] in eos:
            eos_index = len(tokens) - 1
            limit = min(max_new_tokens, eos_index + max_draft_len + 1)
    visual_mask = torch.zeros(prompt_len, dtype=torch.bool, device="cpu")  # a trace is on the CPU
    visual_scores = torch.zeros(prompt_len, device="cpu")
    positions = pre.visual_positions.cpu()
    visual_mask[positions] = True
    visual_scores[positions] = pre.visual_scores.float().cpu()
    return TargetTrace(
        prompt_len=prompt_len,
        tokens=torch.cat((prompt_ids, torch.tensor(tokens, dtype=torch.long, device="cpu"))),
        last_hidden=torch.cat(hidden),
        layer_hidden={int(i): pre.layer_hidden[i][0].float().cpu() for i in layers},
        visual_mask=visual_mask, visual_scores=visual_scores, eos_index=eos_index,
        max_new_tokens=max_new_tokens,
    )


@torch.inference_mode()
def draft_ranks(draft: DreamDraft, trace: TargetTrace, spec: SubnetSpec,
                widths: Sequence[int], chunk: int = 64) -> np.ndarray:
    """Where the target's token ranks among the draft's, per start and level ->
    (n_starts, len(widths)) int.

    The draft runs through its own `forward` (no re-implementation): a row for start t is the
    draft's text positions up to y_t with true inputs, followed by the target's tokens
    y_{t+1}.. with the draft's *own* features (what a drafter has along the path the target
    accepts: at temperature 0 that path is the target's greedy continuation, in a chain or a
    tree alike). At level j the entry is the rank of y_{t+j} in the draft's distribution (0 =
    its argmax; ties broken toward the lower token id, as `argmax` and the tree drafter's
    stable sort do), or `widths[j-1]` when it is not among the top `widths[j-1]` (that node is
    not in any tree the caller scores) or the row stopped before level j. A row stops after
    its first level outside the widths; rows are right-padded and masked, one more token per
    row and level.
    """
    n_levels = len(widths)
    n_starts = trace.n_starts
    ranks = np.tile(np.asarray(widths, dtype=np.int64), (n_starts, 1))
    if n_starts == 0 or n_levels == 0:
        return ranks
    device = next(draft.parameters()).device
    dtype = next(draft.parameters()).dtype
    seq = int(trace.tokens.shape[0])
    # host-side bookkeeping (which starts are alive, what they drafted) stays on the CPU with
    # the trace; the draft's inputs and features live on its device
    is_text = torch.ones(seq, dtype=torch.bool, device="cpu")
    with draft.using(spec.arch):  # the prompt positions the subnet's own sequence holds
        is_text[: trace.prompt_len] = draft.draft_positions(
            trace.visual_mask[None], trace.visual_scores[None])[0]
    text_pos = is_text.nonzero().flatten()  # (n_text,) target positions the draft runs over
    n_hidden = int(trace.last_hidden.shape[0])
    text_pos = text_pos[text_pos <= n_hidden]  # a position needs H_{p-1}
    hidden = trace.last_hidden.to(device, dtype)
    prev_all = torch.cat((torch.zeros(1, hidden.shape[-1], device=device, dtype=dtype),
                          hidden))[text_pos]  # (n_text, hidden) H_{p-1}
    ids_all = trace.tokens[text_pos].to(device)
    pos_all = text_pos.to(device)
    cont = trace.continuation
    with draft.using(spec.arch):
        memory = draft.memory(trace.layer_hidden[spec.inject_layer][None].to(device, dtype),
                              trace.visual_mask[None].to(device),
                              trace.visual_scores[None].to(device))
        # Level 1 for every start at once: the teacher-forced pass over all text positions.
        feats = draft(ids_all[None], prev_all[None], pos_all[None], memory).feature[0]
        start_idx = torch.searchsorted(
            pos_all, torch.arange(n_starts, device=device) + trace.prompt_len)  # (n_starts,)
        start_host = start_idx.cpu()  # read per row by `_rollout_step`: one copy, not one each
        starts = torch.arange(n_starts, device="cpu")
        ranks[:, 0] = _rank(draft.logits(feats[start_idx]), starts + 1, cont, widths[0])
        rolled = feats[start_idx][:, None]  # (n_starts, 1, hidden) rollout features
        alive = ranks[:, 0] < widths[0]
        for j in range(2, n_levels + 1):
            rows = np.flatnonzero(alive & (starts.numpy() + j < len(cont)))
            if len(rows) == 0:
                break
            step_feat = torch.empty(len(rows), hidden.shape[-1], device=device, dtype=dtype)
            for c in range(0, len(rows), chunk):
                part = torch.as_tensor(rows[c:c + chunk], device="cpu")
                # the path so far: the target's own tokens y_{t+1} .. y_{t+j-1}
                path = cont[part[:, None] + torch.arange(1, j, device="cpu")]
                step_feat[c:c + len(part)] = _rollout_step(
                    draft, memory, ids_all, prev_all, pos_all, start_host[part], path,
                    rolled[part.to(device)])
            index = torch.as_tensor(rows, device="cpu") + j
            ranks[rows, j - 1] = _rank(draft.logits(step_feat), index, cont, widths[j - 1])
            alive = np.zeros(n_starts, dtype=bool)
            alive[rows] = ranks[rows, j - 1] < widths[j - 1]
            grown = torch.zeros(n_starts, j, hidden.shape[-1], device=device, dtype=dtype)
            grown[:, : j - 1] = rolled
            grown[torch.as_tensor(rows, device=device), j - 1] = step_feat
            rolled = grown
    return ranks


def _rank(logits: Tensor, index: Tensor, continuation: Tensor, cap: int) -> np.ndarray:
    """Rank of continuation[index[i]] in logits[i] (ties: lower id first), capped at `cap`
    (`cap` also past the continuation's end) -> (rows,) int."""
    logits = logits.float()
    inside = (index < len(continuation)).to(logits.device)
    target = continuation[index.clamp(max=len(continuation) - 1)].to(logits.device)
    value = logits.gather(1, target[:, None])  # (rows, 1)
    ids = torch.arange(logits.shape[1], device=logits.device)[None]
    rank = ((logits > value) | ((logits == value) & (ids < target[:, None]))).sum(1)
    rank = torch.where(inside, rank.clamp(max=cap), torch.full_like(rank, cap))
    return rank.cpu().numpy()


def trace_sample(trace: TargetTrace) -> TargetSample:
    """A trace as a training sample (prompt + continuation, H_p per position, the inject
    layers' prompt states), so that `ranks.path_ranks` ranks all its starts in one pass per level.
    The last position has no hidden state (nothing reads it): its row is zero."""
    hidden = trace.last_hidden
    pad = int(trace.tokens.shape[0]) - int(hidden.shape[0])
    if pad > 0:
        hidden = torch.cat((hidden, hidden.new_zeros(pad, hidden.shape[-1])))
    return TargetSample(input_ids=trace.tokens, prompt_len=trace.prompt_len,
                        visual_mask=trace.visual_mask, visual_scores=trace.visual_scores,
                        memory_hidden=trace.layer_hidden, distill_hidden={},
                        last_hidden=hidden[: int(trace.tokens.shape[0])])


def batched_ranks(draft: DreamDraft, traces: Sequence[TargetTrace], spec: SubnetSpec,
                  widths: Sequence[int], batch_size: int = 8) -> list[np.ndarray]:
    """`draft_ranks` of every trace, from the parallel passes of `ranks.path_ranks` over
    batches of traces (the same ranks: a test compares them) -> per trace (n_starts, level)."""
    device = next(draft.parameters()).device
    out: list[np.ndarray] = []
    for start in range(0, len(traces), batch_size):
        part = traces[start: start + batch_size]
        samples = [trace_sample(t) for t in part]
        with_visual = draft.config.visual_in_self
        batch = collate(samples, with_visual).to(device)
        ranks = path_ranks(draft, batch, spec, widths).cpu()
        for i, (trace, sample) in enumerate(zip(part, samples, strict=True)):
            first = sample.answer_index(with_visual)  # y_0's index in the row
            out.append(ranks[i, first: first + trace.n_starts].numpy().astype(np.int64))
    return out


def draft_matches(draft: DreamDraft, trace: TargetTrace, spec: SubnetSpec, max_draft_len: int,
                  chunk: int = 64) -> np.ndarray:
    """Leading draft tokens equal to the continuation, per start -> (n_starts,) int: the
    chain's accepted levels (`draft_ranks` with width 1 at every level)."""
    ranks = draft_ranks(draft, trace, spec, (1,) * max_draft_len, chunk)
    return accepted_levels(ranks, (1,) * max_draft_len)


def _rollout_step(draft: DreamDraft, memory, ids_all: Tensor, prev_all: Tensor, pos_all: Tensor,
                  start_idx: Tensor, tokens: Tensor, rolled: Tensor) -> Tensor:
    """Feature of the next rollout position for a few starts -> (rows, hidden).

    start_idx: (rows,) index into the text positions of each row's y_t (on the CPU)
    tokens:    (rows, r) the row's rollout tokens so far (d_1..d_r)
    rolled:    (rows, r, hidden) the draft features that produced them (F of y_t, d_1, ...)
    """
    rows, r = tokens.shape
    device = prev_all.device
    lengths = start_idx + 1 + r  # real positions per row
    width = int(lengths.max())
    ids = torch.zeros(rows, width, dtype=torch.long, device=device)
    prev = torch.zeros(rows, width, prev_all.shape[-1], device=device, dtype=prev_all.dtype)
    pos = torch.zeros(rows, width, dtype=torch.long, device=device)
    mask = torch.zeros(rows, width, dtype=torch.bool, device=device)
    for i in range(rows):
        s = int(start_idx[i]) + 1
        ids[i, :s], prev[i, :s], pos[i, :s] = ids_all[:s], prev_all[:s], pos_all[:s]
        ids[i, s:s + r] = tokens[i].to(device)
        prev[i, s:s + r] = rolled[i]
        pos[i, s:s + r] = pos_all[s - 1] + torch.arange(1, r + 1, device=device)
        mask[i, : s + r] = True
    mem = type(memory)(keys=memory.keys.expand(rows, -1, -1, -1),
                       values=memory.values.expand(rows, -1, -1, -1),
                       mask=memory.mask.expand(rows, -1))
    feature = draft(ids, prev, pos, mem, attention_mask=mask).feature  # (rows, width, hidden)
    return feature[torch.arange(rows, device=device), (lengths - 1).to(device)]


def dtype_name(adapter: TargetAdapter) -> str:
    """The dtype the target (and the draft with it) ran in, as a row records it: ``"float16"``
    for ``torch.float16``. Part of a row's key: acceptance shifts with the precision."""
    return str(adapter.dtype).removeprefix("torch.")


def accept_rates(lengths: Sequence[int], proposed: Sequence[int], draft_len: int) -> list[float]:
    """Per draft position i: accepted / offered over the cycles that proposed it (NaN if none)."""
    lengths_a, proposed_a = np.asarray(lengths), np.asarray(proposed)
    out = []
    for i in range(1, draft_len + 1):
        offered = proposed_a >= i
        out.append(float(np.mean(lengths_a[offered] - 1 >= i)) if offered.any() else float("nan"))
    return out


def pooled_tau(per_prompt: Sequence[tuple[list[int], list[int]]], n_boot: int,
               rng: np.random.Generator) -> tuple[float, float, float]:
    """tau = all tokens / all cycles, and a bootstrap 95% interval resampling prompts."""
    tokens = np.array([sum(c[0]) for c in per_prompt], dtype=np.float64)
    cycles = np.array([len(c[0]) for c in per_prompt], dtype=np.float64)
    if cycles.sum() == 0:
        return 1.0, 1.0, 1.0
    tau = float(tokens.sum() / cycles.sum())
    if len(per_prompt) < 2 or n_boot <= 0:
        return tau, tau, tau
    picks = rng.integers(0, len(per_prompt), size=(n_boot, len(per_prompt)))
    t, c = tokens[picks].sum(1), cycles[picks].sum(1)
    boot = t[c > 0] / c[c > 0]
    return tau, float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


class TeacherForcedScorer:
    """The `AcceptanceScorer` of the search, over one evaluation set.

    Traces the target once per prompt (lazily, then kept); scoring a spec rolls the draft out
    once for its architecture (`SubnetSpec.arch`: heads, visual_keep,
    inject_layer, depth, mlp and draft_vocab -- each draft vocabulary is rolled out on its own)
    and returns rows for every draft length in `draft_lens` and every tree in `trees` of that
    architecture (they are free), so the cache fills a whole architecture at a time.
    """

    def __init__(self, adapter: TargetAdapter, draft: DreamDraft,
                 prompts: Sequence[Mapping[str, Tensor]], *, supernet_hash: str, dataset_id: str,
                 max_new_tokens: int = 64, draft_lens: Sequence[int] = tuple(range(1, 8)),
                 trees: Sequence[Sequence[int]] = (), n_boot: int = 1000, seed: int = 0,
                 show_progress: bool | None = None) -> None:
        if not prompts:
            raise InputError("no evaluation prompts to score acceptance on; "
                             "give a non-empty --data")
        if max_new_tokens < 2:
            raise InputError(f"max_new_tokens={max_new_tokens} must be at least 2 to draft at all")
        self.adapter, self.draft, self.prompts = adapter, draft, list(prompts)
        self.supernet_hash, self.dataset_id = supernet_hash, dataset_id
        self.max_new_tokens = int(max_new_tokens)
        self.draft_lens = tuple(sorted(set(int(g) for g in draft_lens)))
        self.trees = tuple(dict.fromkeys(TokenTree(tuple(t)).branching for t in trees))
        self.n_boot, self.seed, self.show_progress = int(n_boot), int(seed), show_progress
        self._traces: list[TargetTrace] | None = None

    @property
    def max_draft_len(self) -> int:
        """The deepest chain or tree scored by default."""
        return max([*self.draft_lens, *(len(t) for t in self.trees)])

    def traces(self) -> list[TargetTrace]:
        if self._traces is None:
            layers = tuple(self.draft.config.inject_layers)
            bar = progress(self.prompts, desc="target greedy traces", unit="prompt",
                           disable=None if self.show_progress is None else not self.show_progress)
            self._traces = [trace_target(self.adapter, p, layers, self.max_new_tokens,
                                         self.max_draft_len) for p in bar]
        return self._traces

    @property
    def context_len(self) -> int:
        """Mean prompt length in tokens."""
        return int(round(float(np.mean([t.prompt_len for t in self.traces()]))))

    @property
    def answer_len(self) -> float:
        """Mean tokens decoded after the first (up to the EOS or the budget), per prompt: what
        the rows' ``n_tokens / n_prompts`` records."""
        return float(np.mean([t.n_starts for t in self.traces()]))

    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        wanted: dict[SubnetSpec, set[tuple[int, tuple[int, ...]]]] = {}
        for s in specs:
            wanted.setdefault(s.arch, set()).add((s.draft_len, s.tree))
        rows: list[AcceptanceRow] = []
        for arch, shapes in wanted.items():
            lens = sorted(set(self.draft_lens) | {g for g, t in shapes if not t})
            trees = list(dict.fromkeys([*self.trees, *(t for _, t in shapes if t)]))
            rows.extend(self.score_arch(arch, lens, trees))
        return rows

    def score_arch(self, arch: SubnetSpec, draft_lens: Sequence[int],
                     trees: Sequence[Sequence[int]] = ()) -> list[AcceptanceRow]:
        """Rows for the chains of `draft_lens` and the `trees` of one architecture, from one rollout
        per prompt (`batched_ranks`, as deep as the deepest shape, as wide at each level as
        the widest)."""
        traces = self.traces()
        shapes = [arch.replace(draft_len=g) for g in draft_lens]
        shapes += [arch.replace(tree=tuple(t)) for t in trees]
        n_levels = max(s.draft_len for s in shapes)
        widths = [max((s.shape.branching[j] for s in shapes if s.draft_len > j), default=1)
                  for j in range(n_levels)]
        ranks = batched_ranks(self.draft, traces, arch, widths)
        out = []
        for spec in shapes:
            # The same seed for every spec: their intervals resample the same prompts.
            rng = np.random.default_rng(self.seed)
            cycles = [simulate_cycles(accepted_levels(r, spec.shape.branching), spec.draft_len,
                                      t.max_new_tokens, t.eos_index)
                      for r, t in zip(ranks, traces, strict=True)]
            tau, lo, hi = pooled_tau(cycles, self.n_boot, rng)
            lengths = [n for c in cycles for n in c[0]]
            offered = [p for c in cycles for p in c[1]]
            out.append(AcceptanceRow(
                spec=spec, tau=tau, tau_lo=lo, tau_hi=hi,
                supernet_hash=self.supernet_hash, dataset_id=self.dataset_id,
                temperature=0.0, dtype=dtype_name(self.adapter),
                max_new_tokens=self.max_new_tokens, method="teacher-forced", n_prompts=len(traces),
                n_tokens=int(sum(lengths)), context_len=self.context_len,
                accept_rates=tuple(accept_rates(lengths, offered, spec.draft_len)),
            ))
        return out
