"""The DREAM draft: decoder layers -> cross-attention layer -> decoder layers -> norm.

The supernet holds `num_layers` decoder layers on each side of the cross-attention; a subnet
of depth d runs the first d before it and the last d after it (the paper's draft: d = 1), so
the layers it skips are those next to the cross-attention and the first and last layers keep
one role in every subnet; every MLP keeps the first `mlp` share of its importance-sorted
channels (Once-for-All's elastic depth and width).

Alignment (EAGLE-style): draft position ``p`` reads the token ``x_p`` (through the target's own
embedding) and the target's last hidden state ``H_{p-1}`` (the feature that predicted ``x_p``;
zeros at p = 0), fuses them with one linear layer, and outputs a feature ``F_p`` trained to
equal ``H_p``; the target's own LM head turns ``F_p`` into the distribution of ``x_{p+1}``.
While drafting, ``F_p`` stands in for the ``H_p`` that is not known yet.

The image reaches the draft two ways. Its *own sequence* (the self-attention's positions and
KV cache) holds the prompt's text, the generated tokens and -- with ``visual_in_self``, the
default -- the kept visual positions (the top ``visual_keep`` fraction ranked by the attention
they *receive* from the text in the target's last layer at prefill), each reading
(image token, H_{p-1}) like any other position; a kept visual token therefore costs attention
work on every drafting step, and dropping it saves that work, as in the paper. The
cross-attention reads a *memory*: the target's hidden states at layer ``inject_layer`` over the
prompt's text and kept visual positions, in their original order. The memory is the prompt
only, known in full at prefill, so training (teacher forced) and drafting see the same memory
and its keys/values are computed once per request. Without ``visual_in_self`` the sequence is
text only and the image reaches the draft through the memory alone (measured worse:
BENCHMARKS.md, 'Ablations: distillation layer and the image').

The target's embedding and LM head are shared, frozen, and not part of this module's
parameters or state dict (they are held outside the module tree and passed in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace, vocab_rows
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.elastic import ElasticAttention, rotary_cos_sin
from dreams_nas.supernet.draft.head import HeadRows, full_logits, vocab_logits
from dreams_nas.supernet.draft.kept import Kept, keep
from dreams_nas.supernet.draft.layers import (
    ActiveWeights,
    CrossAttentionLayer,
    DecoderLayer,
    LayerInput,
    SwiGLU,
    cross_step,
    decoder_step,
    skipped_layers,
)
from dreams_nas.supernet.draft.state import (
    DraftCache,
    DraftOutput,
    Memory,
    SharedTargetModules,
    StaticDraftCache,
    causal_mask,
    gather_rows,
    select_memory_positions,
)
from dreams_nas.supernet.ops.linear import linear
from torch import Tensor, nn


class DreamDraft(nn.Module):
    """The elastic DREAM-S draft (the supernet); an extracted subnet uses the same class."""

    def __init__(self, config: DraftConfig, shared: SharedTargetModules | None = None) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fuse = nn.Linear(2 * h, h, bias=False)
        self.layers_in = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.cross = CrossAttentionLayer(config) if config.cross_attention else None
        self.layers_out = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.memory_inputs = nn.ModuleDict({str(lyr): LayerInput(config)
                                            for lyr in config.inject_layers})
        self._shared = shared  # plain attribute: not a submodule, not saved
        self._active = config.spec or config.largest()
        self._head_rows = HeadRows()  # the LM head's rows of the draft vocabulary
        self._checked: set[SubnetSpec] = set()  # the specs `set_active` accepted
        # (heads, depth, mlp) -> the weights of those subnets: `active_weights`
        self._weights: dict[tuple[int, int, float], Kept] = {}
        if config.has_vocab_order:
            # target token ids, most frequent in the self-distillation answers first
            # (`set_vocab_order`); an extracted subnet keeps only the ones it predicts over
            rows = (config.vocab_size if config.spec is None
                    else vocab_rows(config.vocab_size, config.spec.draft_vocab))
            # cpu: built with the module, moved with it by .to()
            self.register_buffer("vocab_order", torch.arange(rows, dtype=torch.long))

    # --- the active subnet: one typed place -----------------------------------------
    @property
    def active(self) -> SubnetSpec:
        return self._active

    def set_active(self, spec: SubnetSpec) -> None:
        """Make `spec` the subnet every forward uses (heads, visual_keep, inject_layer, depth,
        mlp). A spec checked once is not checked again (a decoding activates its subnet
        every cycle)."""
        if spec in self._checked:
            self._active = spec
            return
        cfg = self.config
        if not 1 <= spec.heads <= cfg.num_heads:
            raise InputError(f"spec {spec.id}: heads={spec.heads} is outside 1..{cfg.num_heads} "
                             "of this draft; pick a subnet of its search space")
        if cfg.spec is None and spec.mlp not in cfg.mlp_shares:
            raise InputError(f"spec {spec.id}: mlp={spec.mlp} is not a width this draft was "
                             f"trained at {list(cfg.mlp_shares)}; pick one of those")
        if cfg.spec is None and spec.draft_vocab not in cfg.vocab_shares:
            raise InputError(f"spec {spec.id}: draft_vocab={spec.draft_vocab} is not a vocabulary "
                             f"share this draft offers {list(cfg.vocab_shares)}; pick one of "
                             "those (or train with `--draft-vocab`)")
        if not 1 <= spec.depth <= cfg.num_layers:
            raise InputError(f"spec {spec.id}: depth={spec.depth} is outside 1..{cfg.num_layers} "
                             "(this draft's layers on each side); pick a subnet of its space")
        if spec.inject_layer not in cfg.inject_layers:
            raise InputError(f"spec {spec.id}: inject_layer={spec.inject_layer} is not one this "
                             f"draft was trained for {list(cfg.inject_layers)}; pick one of those")
        if cfg.spec is not None and spec.arch != cfg.spec.arch:
            raise InputError(f"this extracted draft is subnet {cfg.spec.id}; "
                             f"it cannot run {spec.id} "
                             "(extract that subnet from the supernet instead)")
        self._checked.add(spec)
        self._active = spec

    def active_weights(self) -> ActiveWeights:
        """The active subnet's weights: its decoder layers' and cross-attention's (the first
        `heads` heads, the MLP's first channels), the fuse and the final norm.

        Without gradients (drafting, profiling, scoring) they are kept per (heads, depth,
        mlp), so a draft step does not slice its weights again; views follow in-place changes
        of the parameters (an optimizer step, a channel permutation), a parameter replaced in
        any way has them sliced again (`supernet.draft.kept`), a copy keeps none. With
        gradients they are sliced for each forward, so each graph has its own views; so they
        are in a compiled step, whose graph slices for free."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self._slice_weights()
        spec = self._active
        key = (spec.heads, spec.depth, spec.mlp)
        kept = self._weights.get(key)
        if kept is None or not kept.current():
            if kept is not None:
                self._weights.clear()  # the others are views of replaced tensors too
            kept = self._weights[key] = keep(self._slice_weights(), self._weight_paths())
        return kept.weights

    def _slice_weights(self) -> ActiveWeights:
        heads, channels = self._active.heads, self.active_channels
        before, after = self.active_layers
        return ActiveWeights(
            self.fuse.weight, tuple(layer.weights(heads, channels) for layer in before),
            None if self.cross is None else self.cross.weights(heads, channels),
            tuple(layer.weights(heads, channels) for layer in after),
            self.norm.weight, self.norm.eps)

    def _weight_paths(self) -> list[tuple[nn.Module, str, bool]]:
        """Where `_slice_weights` reads (`kept.keep`): the layer lists, the modules it uses."""
        d, n = self._active.depth, len(self.layers_out)
        tops = ["fuse", "norm", *(["cross"] if self.cross is not None else [])]
        return [(self, "layers_in", False), (self, "layers_out", False),
                *((self, name, True) for name in tops),
                *((self.layers_in, str(i), True) for i in range(d)),
                *((self.layers_out, str(i), True) for i in range(n - d, n))]

    def _apply(self, fn: Any, recurse: bool = True) -> DreamDraft:
        self._weights.clear()  # views of the tensors `fn` replaces: freed now, not at next use
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy`, pickle) keeps no cache: views of the original's tensors."""
        return {**super().__getstate__(), "_weights": {}, "_head_rows": HeadRows(),
                "_steps": None}  # its compiled steps (`DraftSteps`) are its own

    @contextlib.contextmanager
    def using(self, spec: SubnetSpec) -> Iterator[DreamDraft]:
        """Run with `spec` active, then restore the previous subnet."""
        previous = self._active
        self.set_active(spec)
        try:
            yield self
        finally:
            self._active = previous

    def space(self, draft_len: Sequence[int] = tuple(range(1, 8)),
              visual_keep: Sequence[float] = (0.25, 0.5, 0.75, 1.0)) -> SearchSpace:
        """The search space this supernet was built for (heads in quarters, every depth up to
        its own, the MLP widths it was trained at)."""
        heads = sorted({max(1, round(self.config.num_heads * q / 4)) for q in (1, 2, 3, 4)})
        return SearchSpace(heads=tuple(heads), visual_keep=tuple(visual_keep),
                           inject_layer=self.config.inject_layers, draft_len=tuple(draft_len),
                           depth=tuple(range(1, self.config.num_layers + 1)),
                           mlp=self.config.mlp_shares, draft_vocab=self.config.vocab_shares)

    # --- shared target modules ------------------------------------------------------
    @property
    def is_attached(self) -> bool:
        """Whether the target's embedding and LM head are attached (`attach`)."""
        return self._shared is not None

    @property
    def shared(self) -> SharedTargetModules:
        if self._shared is None:
            raise RuntimeError("this draft has no target embedding / LM head; "
                               "call attach(...) first")
        return self._shared

    def attach(self, shared: SharedTargetModules) -> None:
        self._shared = shared

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.shared.embed_tokens(input_ids)

    def logits(self, feature: Tensor) -> Tensor:
        """feature: (..., hidden) -> (..., vocab) through the target's LM head.

        With a draft vocabulary (`SubnetSpec.draft_vocab` < 1) only the head's rows of the
        `vocab_rows` most frequent tokens are computed (`head.vocab_logits`)."""
        head = self.shared.lm_head
        rows = self.vocab_rows_of(self._active)
        if rows >= self.config.vocab_size:
            return full_logits(head, feature)
        return vocab_logits(head, feature, self.vocab_order, rows, self._head_rows)

    def vocab_rows_of(self, spec: SubnetSpec) -> int:
        """Tokens `spec` predicts over (the whole vocabulary at draft_vocab 1)."""
        if self.config.spec is not None and self.config.has_vocab_order:
            return int(self.vocab_order.shape[0])
        return vocab_rows(self.config.vocab_size, spec.draft_vocab)

    def set_vocab_order(self, order: Tensor) -> None:
        """Rank the target's tokens for the draft vocabularies: `order` holds every token id
        once, most frequent first (`supernet.training.vocab.frequency_order`)."""
        if not self.config.has_vocab_order or self.config.spec is not None:
            raise InputError("this draft offers no draft vocabulary below the whole one "
                             "(DraftConfig.vocab_shares); train it with `--draft-vocab`")
        order = torch.as_tensor(order, dtype=torch.long, device="cpu").flatten()
        size = self.config.vocab_size
        if (order.numel() != size or not torch.equal(
                torch.sort(order).values, torch.arange(size, device="cpu"))):
            raise InputError(f"a vocabulary order must hold each of the {size} token ids once; "
                             f"got {order.numel()} ids")
        self.vocab_order.copy_(order.to(self.vocab_order.device))

    # --- forward --------------------------------------------------------------------
    def memory(self, layer_hidden: Tensor, visual_mask: Tensor, visual_scores: Tensor,
               prompt_mask: Tensor | None = None) -> Memory | None:
        """Cross-attention keys/values for the active subnet.

        layer_hidden: (batch, prompt, hidden) target hidden states at `active.inject_layer`
        visual_mask/visual_scores/prompt_mask: (batch, prompt) as in `select_memory_positions`
        """
        if self.cross is None:
            return None
        spec = self._active
        if prompt_mask is None:
            prompt_mask = torch.ones_like(visual_mask, dtype=torch.bool)
        keep = select_memory_positions(visual_mask, visual_scores, prompt_mask, spec.visual_keep)
        states, mask = gather_rows(layer_hidden, keep)  # (batch, mem, hidden)
        states = self.memory_inputs[str(spec.inject_layer)](states)
        k, v = self.cross.attn.project_kv(states, spec.heads)
        # one row pads nothing (gather_rows pads each row to the longest)
        return Memory(keys=k, values=v, mask=mask, padded=layer_hidden.shape[0] > 1)

    @property
    def active_layers(self) -> tuple[list[DecoderLayer], list[DecoderLayer]]:
        """The decoder layers the active subnet runs before and after the cross-attention:
        the first `depth` of the stack before it and the *last* `depth` of the stack after it,
        so every subnet reads its input with the same first layer and writes the feature the
        LM head reads with the same last layer; a shallower subnet skips the layers next to
        the cross-attention."""
        d = self._active.depth
        return list(self.layers_in[:d]), list(self.layers_out[len(self.layers_out) - d:])

    @property
    def active_channels(self) -> int:
        """The MLP intermediate channels the active subnet keeps."""
        return self.channels_of(self._active)

    def channels_of(self, spec: SubnetSpec) -> int:
        """The MLP intermediate channels `spec` keeps (an extracted draft keeps all its own)."""
        if self.config.spec is not None:
            return self.config.intermediate_size
        return self.config.mlp_channels(spec.mlp)

    def draft_positions(self, visual_mask: Tensor, visual_scores: Tensor,
                        prompt_mask: Tensor | None = None) -> Tensor:
        """Which prompt positions are in the active subnet's own sequence -> bool (batch, prompt).

        Every text position, and with ``visual_in_self`` the visual positions it keeps (those of
        its memory); arguments as in `select_memory_positions` (any length: positions past the
        prompt are text)."""
        if prompt_mask is None:
            prompt_mask = torch.ones_like(visual_mask, dtype=torch.bool)
        if not self.config.visual_in_self:
            return prompt_mask & ~visual_mask
        return select_memory_positions(visual_mask, visual_scores, prompt_mask,
                                       self._active.visual_keep)

    def forward(self, input_ids: Tensor, prev_hidden: Tensor, position_ids: Tensor,
                memory: Memory | None, *, attention_mask: Tensor | None = None,
                cache: DraftCache | StaticDraftCache | None = None,
                tree_mask: Tensor | None = None) -> DraftOutput:
        """Run the active subnet over new text positions.

        input_ids:      (batch, seq) tokens x_p
        prev_hidden:    (batch, seq, hidden) target last hidden H_{p-1} (or the draft's own F_{p-1})
        position_ids:   (batch, seq) positions in the target's sequence (rotary)
        memory:         from `memory(...)` (None only for the text-only draft)
        attention_mask: bool (batch, seq) True at the keys that exist (training: real tokens,
                        with right padding, and the visual tokens the subnet keeps); a
                        position always sees itself, so a dropped one stays finite
        cache:          the draft's KV cache; new positions are appended to it
        tree_mask:      bool (seq, tree_len + seq): which of the cache's last `tree_len`
                        positions (a token tree's nodes drafted so far) and of the new ones
                        each new position sees (its ancestors and itself); every earlier
                        cache position stays visible. None: causal.
        """
        w = self.active_weights()
        x = self.embed(input_ids).to(prev_hidden.dtype)
        h = linear(torch.cat((x, prev_hidden), dim=-1), w.fuse)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        if cos.dtype != h.dtype:  # once for every layer (`apply_rotary` would per call)
            cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        mask: Tensor | None = None  # one new position sees every cached one and itself
        if cache is not None and cache.static:  # a fixed-capacity cache: a mask over all of it
            mask = cache.mask(input_ids.shape[1], h.device, tree_mask)
        elif input_ids.shape[1] > 1 or attention_mask is not None or tree_mask is not None:
            mask = causal_mask(input_ids.shape[1], 0 if cache is None else cache.length,
                               attention_mask, h.device)
            if tree_mask is not None:
                mask = mask.clone()
                mask[..., mask.shape[-1] - tree_mask.shape[-1]:] = tree_mask.to(h.device)
        for i, layer in enumerate(w.before):  # cache slots: 0..d-1 before, d..2d-1 after
            h = decoder_step(h, layer, cos, sin, mask, cache, i)
        cross_out = None
        if w.cross is not None:
            if memory is None:
                raise ValueError("this draft has a cross-attention layer: pass its memory")
            h = cross_step(h, w.cross, memory)
            cross_out = h
        for i, layer in enumerate(w.after, start=len(w.before)):
            h = decoder_step(h, layer, cos, sin, mask, cache, i)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        return DraftOutput(feature=F.rms_norm(h, (h.shape[-1],), w.norm, w.norm_eps),
                           cross_out=cross_out)

    @classmethod
    def initialised(cls, config: DraftConfig, shared: SharedTargetModules | None, seed: int
                    ) -> DreamDraft:
        """A fresh draft whose random init depends on `seed` only (the global RNG is untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(config, shared)

    def blocks(self) -> list[DecoderLayer | CrossAttentionLayer]:
        """Every decoder and cross-attention layer, in forward order of the largest subnet."""
        return [*self.layers_in, *([self.cross] if self.cross is not None else []),
                *self.layers_out]

    def attentions(self) -> list[ElasticAttention]:
        """Every elastic attention, in forward order (each sorts its own heads)."""
        return [layer.attn for layer in self.blocks()]

    def mlps(self) -> list[SwiGLU]:
        """Every elastic MLP, in forward order (each sorts its own channels)."""
        return [layer.mlp for layer in self.blocks()]

    def num_params(self, spec: SubnetSpec | None = None) -> int:
        """Parameters a subnet really uses (the shared embedding/LM head excluded)."""
        spec = spec or self._active
        cfg = self.config
        per_head = 4 * cfg.hidden_size * cfg.head_dim
        per_channel = 3 * cfg.hidden_size
        blocks = 2 * spec.depth + (1 if self.cross is not None else 0)
        skipped = skipped_layers(cfg.num_layers, spec.depth)
        total = 0
        for name, p in self.named_parameters():
            if name.startswith("memory_inputs.") and not name.startswith(
                    f"memory_inputs.{spec.inject_layer}."):
                continue
            if name.startswith(skipped) or ".attn." in name or ".mlp." in name:
                continue
            total += p.numel()
        return total + blocks * (per_head * spec.heads
                                 + per_channel * self.channels_of(spec))
