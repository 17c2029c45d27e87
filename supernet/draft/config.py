"""The DREAM draft's configuration: sizes, the layers it may read, the subnet it holds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec

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
    cross_attention: bool = True  # False: no cross-attention layer (two decoder layers)
    # True: the kept visual tokens are positions of the draft's own sequence (its
    # self-attention reads them, so each kept token costs attention work on every step), as
    # well as of the cross-attention memory; False: the memory only. With neither, the draft
    # is text-only.
    visual_in_self: bool = True
    # Decoder layers on each side of the cross-attention (the supernet's stacks; a subnet uses
    # the first `SubnetSpec.depth` of each).
    num_layers: int = 1
    # The MLP widths (shares of intermediate_size) the supernet is trained and searched at;
    # (1.0,): the whole MLP only.
    mlp_shares: tuple[float, ...] = (1.0,)
    # The draft vocabularies (shares of vocab_size, most frequent tokens first: the model's
    # `vocab_order`) the supernet offers; (1.0,): the target's whole vocabulary only.
    vocab_shares: tuple[float, ...] = (1.0,)
    # Set on an extracted draft only: the subnet it was cut from.
    spec: SubnetSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inject_layers", tuple(int(x) for x in self.inject_layers))
        shares = tuple(sorted({float(x) for x in self.mlp_shares}))
        if not shares or not all(0.0 < x <= 1.0 for x in shares):
            raise InputError(f"mlp_shares={list(self.mlp_shares)} must be shares in (0, 1], "
                             "e.g. [0.25, 0.5, 1.0]")
        object.__setattr__(self, "mlp_shares", shares)
        vocab = tuple(sorted({float(x) for x in self.vocab_shares}))
        if not vocab or not all(0.0 < x <= 1.0 for x in vocab):
            raise InputError(f"vocab_shares={list(self.vocab_shares)} must be shares in (0, 1], "
                             "e.g. [0.25, 1.0]")
        object.__setattr__(self, "vocab_shares", vocab)
        if self.head_dim % 2:
            raise InputError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.num_layers < 1:
            raise InputError(f"num_layers={self.num_layers} must be at least 1 (decoder layers "
                             "on each side of the cross-attention)")
        if not self.inject_layers:
            raise InputError("inject_layers is empty; list the target layers the draft may read")
        bad = [x for x in self.inject_layers if not 0 <= x <= self.num_target_layers]
        if bad:
            raise InputError(
                f"inject_layers {bad} are outside the target's hidden states "
                f"0..{self.num_target_layers}"
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
        data["mlp_shares"] = list(self.mlp_shares)
        data["vocab_shares"] = list(self.vocab_shares)
        data["spec"] = None if self.spec is None else self.spec.to_dict()
        return {"schema_version": CONFIG_SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftConfig:
        """The config `to_dict` wrote: this schema version, every field present (a config
        without one was written by another dreams-nas version and is refused, naming it)."""
        data = dict(data)
        missing = [name for name in ("schema_version", *cls.__dataclass_fields__)
                   if name not in data]
        if missing:
            raise InputError(f"the draft config lacks {missing}: another dreams-nas version "
                             "wrote it")
        version = data.pop("schema_version")
        if version != CONFIG_SCHEMA_VERSION:
            raise InputError(f"draft config schema_version={version!r} is another dreams-nas "
                             f"version's (this one reads {CONFIG_SCHEMA_VERSION})")
        spec = data.pop("spec")
        return cls(**data, spec=None if spec is None else SubnetSpec.from_dict(spec))

    def largest(self) -> SubnetSpec:
        return SubnetSpec(heads=self.num_heads, visual_keep=1.0,
                          inject_layer=max(self.inject_layers), draft_len=1,
                          depth=self.num_layers, mlp=max(self.mlp_shares),
                          draft_vocab=max(self.vocab_shares))

    @property
    def has_vocab_order(self) -> bool:
        """Whether the draft holds a token frequency order (`DreamDraft.vocab_order`): a
        supernet offering a share below 1, or a subnet extracted at one."""
        return min(self.vocab_shares) < 1.0

    def mlp_channels(self, share: float) -> int:
        """Intermediate channels a subnet with MLP share `share` keeps (a prefix):
        ceil(share * intermediate_size), at least 1."""
        return mlp_channels(self.intermediate_size, share)


def mlp_channels(intermediate_size: int, share: float) -> int:
    """ceil(share * intermediate_size), within 1..intermediate_size."""
    return max(1, min(intermediate_size, math.ceil(share * intermediate_size - 1e-9)))


def _rope_theta(cfg: Any) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0) if isinstance(params, dict) else 10000.0
    return float(theta)
