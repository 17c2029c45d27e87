"""The DREAM draft: decoder layer -> cross-attention layer -> decoder layer -> norm.

Alignment (EAGLE-style): draft position ``p`` reads the token ``x_p`` (through the target's own
embedding) and the target's last hidden state ``H_{p-1}`` (the feature that predicted ``x_p``;
zeros at p = 0), fuses them with one linear layer, and outputs a feature ``F_p`` trained to
equal ``H_p``; the target's own LM head turns ``F_p`` into the distribution of ``x_{p+1}``.
While drafting, ``F_p`` stands in for the ``H_p`` that is not known yet.

The draft's self-attention runs over the *text* positions only (prompt text and generated
tokens); what the image says reaches it through the cross-attention, whose keys/values are the
target's hidden states at layer ``inject_layer`` over the prompt: every text position plus the
kept visual positions (the top ``visual_keep`` fraction ranked by the attention they *receive*
from the text in the target's last layer at prefill), in their original order. The memory is
the prompt only, known in full at prefill, so training (teacher forced) and drafting see the
same memory and its keys/values are computed once per request.

The target's embedding and LM head are shared, frozen, and not part of this module's
parameters or state dict (they are held outside the module tree and passed in).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace, SubnetSpec
from dreams_nas.supernet.draft.elastic import ElasticAttention, apply_rotary, rotary_cos_sin
from torch import Tensor, nn

CONFIG_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class DraftConfig:
    """Shape of a draft (the supernet's maximal one, or an extracted subnet's)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    inject_layers: tuple[int, ...]  # target hidden-state indices the cross-attention can read
    num_target_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    cross_attention: bool = True  # False: the text-only ablation (two decoder layers)
    # Set on an extracted draft only: the subnet it was cut from.
    spec: SubnetSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inject_layers", tuple(int(x) for x in self.inject_layers))
        if self.head_dim % 2:
            raise InputError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.inject_layers:
            raise InputError("inject_layers is empty; list the target layers the draft may read")
        bad = [x for x in self.inject_layers if not 0 <= x <= self.num_target_layers]
        if bad:
            raise InputError(
                f"inject_layers {bad} are outside the target's hidden states 0..{self.num_target_layers}"
            )

    @classmethod
    def for_target(cls, target_text_config: Any, inject_layers: Sequence[int],
                   num_heads: int | None = None, **kwargs: Any) -> DraftConfig:
        """A draft as wide as the target's text model (its hidden size must match the LM head)."""
        cfg = target_text_config
        heads = int(num_heads or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        return cls(hidden_size=int(cfg.hidden_size), num_heads=heads, head_dim=head_dim,
                   intermediate_size=int(cfg.intermediate_size), vocab_size=int(cfg.vocab_size),
                   inject_layers=tuple(inject_layers),
                   num_target_layers=int(cfg.num_hidden_layers),
                   rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
                   rope_theta=float(_rope_theta(cfg)), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inject_layers"] = list(self.inject_layers)
        data["spec"] = None if self.spec is None else self.spec.to_dict()
        return {"schema_version": CONFIG_SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftConfig:
        data = dict(data)
        version = data.pop("schema_version", CONFIG_SCHEMA_VERSION)
        if version != CONFIG_SCHEMA_VERSION:
            raise InputError(f"draft config schema_version={version!r} is not supported "
                             f"(this dreams-nas reads {CONFIG_SCHEMA_VERSION}); retrain or re-extract")
        spec = data.pop("spec", None)
        return cls(**data, spec=None if spec is None else SubnetSpec.from_dict(spec))

    def largest(self) -> SubnetSpec:
        return SubnetSpec(heads=self.num_heads, visual_keep=1.0,
                          inject_layer=max(self.inject_layers), draft_len=1)


def _rope_theta(cfg: Any) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0) if isinstance(params, dict) else 10000.0
    return float(theta)


# --- state passed around --------------------------------------------------------------
@dataclass
class Memory:
    """Cross-attention keys/values for one subnet over the prompt's kept positions."""

    keys: Tensor  # (batch, heads, mem, head_dim)
    values: Tensor  # (batch, heads, mem, head_dim)
    mask: Tensor  # bool (batch, mem): True = a real (not padded) memory slot

    @property
    def length(self) -> int:
        return int(self.keys.shape[2])


@dataclass
class DraftCache:
    """The draft's own KV cache (self-attention layers), reused across speculative cycles."""

    keys: list[Tensor | None] = field(default_factory=list)  # per layer (batch, heads, len, d)
    values: list[Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.keys or self.keys[0] is None else int(self.keys[0].shape[2])

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None:
            k = torch.cat((old_k, k), dim=2)
            v = torch.cat((old_v, v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drop drafted positions after a verify)."""
        if length < 0 or length > self.length:
            raise ValueError(f"cannot crop a draft cache of {self.length} positions to {length}")
        self.keys = [None if k is None else k[:, :, :length] for k in self.keys]
        self.values = [None if v is None else v[:, :, :length] for v in self.values]


@dataclass
class DraftOutput:
    feature: Tensor  # (batch, seq, hidden): the draft's final (normed) feature, ~ target last hidden
    cross_out: Tensor | None  # (batch, seq, hidden): the cross-attention block's output


@dataclass(frozen=True)
class SharedTargetModules:
    """The target's token embedding and LM head: shared, frozen, never copied or saved."""

    embed_tokens: nn.Module
    lm_head: nn.Module


# --- visual token selection (pure functions) ------------------------------------------
def keep_count(num_visual: int, visual_keep: float) -> int:
    """How many of `num_visual` tokens a subnet keeps: ceil(keep * n), at least 1 if any."""
    if num_visual == 0:
        return 0
    return max(1, min(num_visual, math.ceil(visual_keep * num_visual - 1e-9)))


def select_memory_positions(visual_mask: Tensor, visual_scores: Tensor, prompt_mask: Tensor,
                            visual_keep: float) -> Tensor:
    """Which prompt positions the cross-attention reads.

    visual_mask:   bool (batch, prompt) True at visual-token positions
    visual_scores: (batch, prompt) attention each position *receives* from the text positions in
                   the target's last layer at prefill (only read at visual positions)
    prompt_mask:   bool (batch, prompt) True at real (not padded) prompt positions
    Returns bool (batch, prompt): every text position and the top `keep_count` visual positions
    by score (ties: the earlier position), in their original order.
    """
    keep = prompt_mask & ~visual_mask
    for b in range(visual_mask.shape[0]):
        vis = torch.nonzero(visual_mask[b] & prompt_mask[b], as_tuple=False).flatten()
        n = keep_count(int(vis.numel()), visual_keep)
        if n == 0:
            continue
        order = torch.sort(visual_scores[b, vis].float(), descending=True, stable=True).indices
        keep[b, vis[order[:n]]] = True
    return keep


def gather_rows(states: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Compact the kept positions of each row to the front, order preserved.

    states: (batch, seq, hidden); keep: bool (batch, seq) -> (batch, kept_max, hidden), mask
    """
    counts = keep.sum(dim=1)
    width = int(counts.max().item()) if counts.numel() else 0
    # stable sort puts kept positions first, each group in its original order
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
    out = states.gather(1, order[..., None].expand(-1, -1, states.shape[-1]))
    mask = torch.arange(width, device=keep.device)[None] < counts[:, None]
    return out, mask


# --- layers ---------------------------------------------------------------------------
class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm Llama-style layer with elastic self-attention and rotary positions."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = ElasticAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: Tensor, heads: int, cos: Tensor, sin: Tensor, mask: Tensor,
                cache: DraftCache | None, index: int) -> Tensor:
        """h: (batch, seq, hidden); mask: bool (batch, 1, seq, keys)."""
        x = self.input_norm(h)
        q = apply_rotary(self.attn.project_q(x, heads), cos, sin)
        k, v = self.attn.project_kv(x, heads)
        k = apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(index, k, v)
        h = h + self.attn.attend(q, k, v, mask)
        return h + self.mlp(self.post_norm(h))


class CrossAttentionLayer(nn.Module):
    """Queries from the draft, keys/values from the memory; tanh gates start closed (zero)."""

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.query_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.attn = ElasticAttention(cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.attn_gate = nn.Parameter(torch.zeros(1))
        self.mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, h: Tensor, heads: int, memory: Memory) -> Tensor:
        q = self.attn.project_q(self.query_norm(h), heads)
        mask = memory.mask[:, None, None, :]  # (batch, 1, 1, mem)
        h = h + torch.tanh(self.attn_gate) * self.attn.attend(q, memory.keys, memory.values, mask)
        return h + torch.tanh(self.mlp_gate) * self.mlp(self.post_norm(h))


class LayerInput(nn.Module):
    """Per-candidate-layer input adapter for the cross-attention memory.

    Why per layer (and not one shared projection or a layer embedding): the target's residual
    stream grows in norm and changes basis with depth, so features of layer 4 and layer 16 live
    on different scales and directions. A separate RMSNorm fixes the scale of each candidate and
    a separate linear map (initialised to the identity) rotates it into the space the shared
    cross-attention k/v projections read. Every candidate is trained (phase 1 and 2 pick a layer
    per step), costs the same at inference whichever layer is chosen, and an extracted draft
    keeps only its own layer's adapter.
    """

    def __init__(self, cfg: DraftConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(cfg.hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))


# --- the draft ------------------------------------------------------------------------
class DreamDraft(nn.Module):
    """The elastic DREAM-S draft (the supernet); an extracted subnet uses the same class."""

    def __init__(self, config: DraftConfig, shared: SharedTargetModules | None = None) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fuse = nn.Linear(2 * h, h, bias=False)
        self.layer_in = DecoderLayer(config)
        self.cross = CrossAttentionLayer(config) if config.cross_attention else None
        self.layer_out = DecoderLayer(config)
        self.norm = nn.RMSNorm(h, eps=config.rms_norm_eps)
        self.memory_inputs = nn.ModuleDict({str(lyr): LayerInput(config)
                                            for lyr in config.inject_layers})
        self._shared = shared  # plain attribute: not a submodule, not saved
        self._active = config.spec or config.largest()

    # --- the active subnet: one typed place -----------------------------------------
    @property
    def active(self) -> SubnetSpec:
        return self._active

    def set_active(self, spec: SubnetSpec) -> None:
        """Make `spec` the subnet every forward uses (heads, visual_keep, inject_layer)."""
        cfg = self.config
        if not 1 <= spec.heads <= cfg.num_heads:
            raise InputError(f"spec {spec.id}: heads={spec.heads} is outside 1..{cfg.num_heads} "
                             "of this draft; pick a subnet of its search space")
        if spec.inject_layer not in cfg.inject_layers:
            raise InputError(f"spec {spec.id}: inject_layer={spec.inject_layer} is not one this draft "
                             f"was trained for {list(cfg.inject_layers)}; pick one of those")
        if cfg.spec is not None and (spec.heads, spec.visual_keep, spec.inject_layer) != (
                cfg.spec.heads, cfg.spec.visual_keep, cfg.spec.inject_layer):
            raise InputError(f"this extracted draft is subnet {cfg.spec.id}; it cannot run {spec.id} "
                             "(extract that subnet from the supernet instead)")
        self._active = spec

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
        """The search space this supernet was built for (heads in quarters)."""
        heads = sorted({max(1, round(self.config.num_heads * q / 4)) for q in (1, 2, 3, 4)})
        return SearchSpace(heads=tuple(heads), visual_keep=tuple(visual_keep),
                           inject_layer=self.config.inject_layers, draft_len=tuple(draft_len))

    # --- shared target modules ------------------------------------------------------
    @property
    def shared(self) -> SharedTargetModules:
        if self._shared is None:
            raise RuntimeError("this draft has no target embedding / LM head; call attach(...) first")
        return self._shared

    def attach(self, shared: SharedTargetModules) -> None:
        self._shared = shared

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.shared.embed_tokens(input_ids)

    def logits(self, feature: Tensor) -> Tensor:
        """feature: (..., hidden) -> (..., vocab) through the target's LM head."""
        head = self.shared.lm_head
        weight = getattr(head, "weight", None)
        return head(feature if weight is None else feature.to(weight.dtype))

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
        return Memory(keys=k, values=v, mask=mask)

    def forward(self, input_ids: Tensor, prev_hidden: Tensor, position_ids: Tensor,
                memory: Memory | None, *, attention_mask: Tensor | None = None,
                cache: DraftCache | None = None) -> DraftOutput:
        """Run the active subnet over new text positions.

        input_ids:      (batch, seq) tokens x_p
        prev_hidden:    (batch, seq, hidden) target last hidden H_{p-1} (or the draft's own F_{p-1})
        position_ids:   (batch, seq) positions in the target's sequence (rotary)
        memory:         from `memory(...)` (None only for the text-only draft)
        attention_mask: bool (batch, seq) True at real tokens (training with right padding)
        cache:          the draft's KV cache; new positions are appended to it
        """
        heads = self._active.heads
        x = self.embed(input_ids).to(prev_hidden.dtype)
        h = self.fuse(torch.cat((x, prev_hidden), dim=-1))
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta)
        mask = self._self_mask(input_ids.shape[1], cache, attention_mask, h.device)
        h = self.layer_in(h, heads, cos, sin, mask, cache, 0)
        cross_out = None
        if self.cross is not None:
            if memory is None:
                raise ValueError("this draft has a cross-attention layer: pass its memory")
            h = self.cross(h, heads, memory)
            cross_out = h
        h = self.layer_out(h, heads, cos, sin, mask, cache, 1)
        return DraftOutput(feature=self.norm(h), cross_out=cross_out)

    @staticmethod
    def _self_mask(seq: int, cache: DraftCache | None, attention_mask: Tensor | None,
                   device: torch.device) -> Tensor:
        past = 0 if cache is None else cache.length
        q_pos = torch.arange(seq, device=device)[:, None] + past
        k_pos = torch.arange(past + seq, device=device)[None]
        mask = (k_pos <= q_pos)[None, None]  # (1, 1, seq, past+seq)
        if attention_mask is not None:
            if past:
                raise ValueError("attention_mask is for training without a cache")
            mask = mask & attention_mask[:, None, None, :]
        return mask

    @classmethod
    def initialised(cls, config: DraftConfig, shared: SharedTargetModules | None, seed: int
                    ) -> DreamDraft:
        """A fresh draft whose random init depends on `seed` only (the global RNG is untouched)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(config, shared)

    def attentions(self) -> list[ElasticAttention]:
        """Every elastic attention, in forward order (each sorts its own heads)."""
        layers = [self.layer_in, *([self.cross] if self.cross is not None else []), self.layer_out]
        return [layer.attn for layer in layers]

    def num_params(self, spec: SubnetSpec | None = None) -> int:
        """Parameters a subnet really uses (the shared embedding/LM head excluded)."""
        spec = spec or self._active
        cfg = self.config
        per_head = 4 * cfg.hidden_size * cfg.head_dim
        attentions = 2 + (1 if self.cross is not None else 0)
        total = 0
        for name, p in self.named_parameters():
            if name.startswith("memory_inputs.") and not name.startswith(
                    f"memory_inputs.{spec.inject_layer}."):
                continue
            if ".attn." not in name:
                total += p.numel()
        return total + attentions * per_head * spec.heads
