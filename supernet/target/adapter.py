"""The target adapter: one class around a Hugging Face VLM that the speculative loop, the draft
trainer and the latency profiler all drive the same way.

    adapter = TargetAdapter.load("llava-hf/llava-1.5-7b-hf", device="cuda", dtype=torch.float16)
    inputs = adapter.build_inputs(image, "What is in the picture?")
    pre = adapter.prefill(inputs, layers=(4, 8))      # KV cache filled; logits of the last position
    out = adapter.verify(tokens)                      # (1, k) new tokens in one forward
    adapter.rollback(n)                               # forget the last n cache positions
    out = adapter.verify_tree(nodes, tree.parents)    # a token tree's nodes in one forward
    adapter.keep_path(path, tree.nodes + 1)           # the cache keeps the accepted path only

Hidden states of requested layers come from forward hooks on those decoder layers only (asking HF
for every hidden state costs noticeably more per step). ``layer_hidden[i]`` follows HF's
``hidden_states[i]`` convention: 0 is the input embeddings (image features merged in), i >= 1 the
output of decoder layer i (1-based), and i == num_layers the final-normed state (what HF returns
there too). The visual-token scores are the attention each visual token *receives* from the text
positions after the image in the last decoder layer, averaged over heads and text queries; q and k
are recomputed from that layer's input by a hook, so the model keeps its fast attention kernel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.targets import BUILTIN, is_named_target
from dreams_nas.supernet.ops.linear import use_fast_linears
from dreams_nas.supernet.target.families import (
    FamilyInfo,
    architecture_hash,
    detect_family,
    structural_token_ids,
    text_decoder,
)
from dreams_nas.supernet.target.tree_attention import (
    LayoutCache,
    check_parents,
    check_path,
    compact_cache,
    sliding_window,
    tree_support,
)
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import rotate_half


@dataclass
class PrefillOutput:
    input_ids: Tensor  # (1, seq)
    logits: Tensor  # (1, vocab) last position, or (1, seq, vocab) with all_logits=True
    last_hidden: Tensor  # (1, seq, hidden) final-normed, feeds lm_head
    layer_hidden: dict[int, Tensor]  # layer i -> (1, seq, hidden), HF hidden_states[i] convention
    visual_positions: Tensor  # (n_visual,) long
    visual_scores: Tensor  # (n_visual,) float32, attention received from text in the last layer


@dataclass
class VerifyOutput:
    logits: Tensor  # (1, k, vocab)
    last_hidden: Tensor  # (1, k, hidden)
    layer_hidden: dict[int, Tensor]  # layer i -> (1, k, hidden)

    def head(self, n: int) -> VerifyOutput:
        """The first n positions (those kept after a partial acceptance)."""
        return VerifyOutput(self.logits[:, :n], self.last_hidden[:, :n],
                            {i: h[:, :n] for i, h in self.layer_hidden.items()})


class TargetAdapter:
    """A loaded VLM with a KV cache, driven one prefill / verify / rollback at a time (batch 1)."""

    def __init__(self, model: nn.Module, processor: Any = None, tokenizer: Any = None,
                 *, target_id: str | None = None, path: str | None = None,
                 processor_error: str | None = None) -> None:
        self.model = model.eval()
        use_fast_linears(model)  # a CPU without native 16-bit products: no slow kernels
        self.processor_error = processor_error  # why the processor could not be loaded
        self.processor = processor
        self.tokenizer = (tokenizer if tokenizer is not None
                          else getattr(processor, "tokenizer", None))
        self.info: FamilyInfo = detect_family(model)
        self.family: str = self.info.name
        self.target_id = target_id
        self.path = path
        self.decoder = text_decoder(model)
        self.text_config = model.config.get_text_config()
        self.embed_tokens: nn.Module = self.decoder.embed_tokens
        self.lm_head: nn.Module = model.get_output_embeddings()
        self.num_layers: int = len(self.decoder.layers)
        self.hidden_size: int = int(self.text_config.hidden_size)
        self.vocab_size: int = int(self.lm_head.weight.shape[0])
        self.eos_token_ids: set[int] = self._eos_ids()
        self._structural = structural_token_ids(self.tokenizer)
        self.cache = None
        self._layouts = LayoutCache()
        self._tree: tuple[int, tuple[int, ...]] | None = None  # (cache_len before, parents)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_model(cls, model: nn.Module, processor: Any = None,
                   tokenizer: Any = None) -> TargetAdapter:
        return cls(model, processor, tokenizer)

    @classmethod
    def load(cls, target: str | Path, *, device: str | torch.device = "cpu",
             dtype: torch.dtype | None = None) -> TargetAdapter:
        """Load from a hub id, a local checkpoint folder, or "builtin" (the built-in target)."""
        from dreams_nas.supernet.target.loading import load_model_and_processor

        target_id = str(target)
        loaded = load_model_and_processor(_checkpoint_of(target), device=device, dtype=dtype)
        return cls(loaded.model, loaded.processor, loaded.tokenizer, target_id=target_id,
                   path=loaded.source, processor_error=loaded.processor_error)

    @staticmethod
    def architecture(target: str | Path) -> str:
        """`architecture_hash` of a target from its config alone (no weights are loaded): a
        command can refuse a mismatch before the slow load."""
        from dreams_nas.supernet.target.loading import load_config

        return architecture_hash(load_config(_checkpoint_of(target)))

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.text_config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, Iterable):
                ids.update(int(v) for v in value)
        if not ids and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    # ----------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    @property
    def tree_note(self) -> str | None:
        """Why this target cannot verify token trees (None when it can)."""
        return tree_support(self.decoder.config)

    @property
    def supports_trees(self) -> bool:
        """Whether `verify_tree` works here (the loop falls back to chains otherwise)."""
        return self.tree_note is None

    def describe(self) -> dict[str, Any]:
        """The ``target`` block of run.json."""
        return {"id": self.target_id, "path": self.path, "family": self.family,
                "num_layers": self.num_layers, "hidden_size": self.hidden_size,
                "architecture_hash": architecture_hash(self.model.config)}

    # ----------------------------------------------------------------- inputs
    def build_inputs(self, image: Any, prompt: str) -> dict[str, Tensor]:
        """Model inputs for one image (PIL image or path) and one user question, built by the
        checkpoint's own processor and chat template (image first); ``<image>\\n{prompt}``
        when the checkpoint has no chat template."""
        if self.processor is None:
            why = self.processor_error
            raise InputError("this target has no processor, so images cannot be encoded"
                             + (f" (loading it failed: {why})" if why else "")
                             + "; load a checkpoint folder with its processor files and install "
                             "what the processor needs (e.g. torchvision)")
        image = open_image(image)
        template = (getattr(self.processor, "chat_template", None)
                    or getattr(self.tokenizer, "chat_template", None))
        if template:
            messages = [{"role": "user",
                         "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True,
                                                      tokenize=False)
        else:
            text = f"{getattr(self.processor, 'image_token', '<image>')}\n{prompt}"
        batch = self.processor(images=[image], text=[text], return_tensors="pt")
        return self._to_device(dict(batch))

    def extend_inputs(self, inputs: dict[str, Tensor], tokens: Tensor) -> dict[str, Tensor]:
        """`inputs` with tokens (1, n) appended as text (input_ids, attention_mask and, for Qwen-VL,
        mm_token_type_ids grow together): teacher forcing a continuation in one prefill."""
        tokens = tokens.to(inputs["input_ids"].device).view(1, -1)
        out = dict(inputs)
        out["input_ids"] = torch.cat([inputs["input_ids"], tokens], dim=1)
        for key in ("attention_mask", "mm_token_type_ids", "token_type_ids"):
            if key in inputs and isinstance(inputs[key], Tensor):
                fill = 1 if key == "attention_mask" else 0
                out[key] = torch.cat([inputs[key],
                                      torch.full_like(tokens, fill).to(inputs[key].dtype)], dim=1)
        return out

    def _to_device(self, inputs: dict[str, Any]) -> dict[str, Any]:
        moved = {}
        for key, value in inputs.items():
            if isinstance(value, Tensor):
                value = value.to(self.device)
                if value.is_floating_point():
                    value = value.to(self.dtype)
            moved[key] = value
        return moved

    # ----------------------------------------------------------------- forwards
    @torch.inference_mode()
    def prefill(self, inputs: dict[str, Tensor], layers: Sequence[int] = (),
                all_logits: bool = False) -> PrefillOutput:
        """Run the prompt, start a fresh KV cache, and return what a draft needs."""
        inputs = self._to_device(inputs)
        input_ids = inputs["input_ids"]  # (1, seq)
        if input_ids.shape[0] != 1:
            raise InputError(f"batch size {input_ids.shape[0]} is not supported; "
                             "the adapter decodes one sequence")
        visual_positions = (input_ids[0] == self.info.image_token_id).nonzero().flatten()
        scores: list[Tensor] = []
        extra = ([self._score_hook(input_ids[0], visual_positions, scores)]
                 if len(visual_positions) else [])
        if self.info.uses_mrope:
            self.model.model.rope_deltas = None  # recomputed from this prompt (stale otherwise)
        hidden, layer_hidden = self._forward(inputs, layers, extra_hooks=extra, fresh=True)
        logits = self.lm_head(hidden if all_logits else hidden[:, -1])
        if not scores:
            scores.append(torch.zeros(len(visual_positions), device=self.device))
        return PrefillOutput(input_ids=input_ids, logits=logits.float(), last_hidden=hidden,
                             layer_hidden=layer_hidden, visual_positions=visual_positions,
                             visual_scores=scores[0])

    @torch.inference_mode()
    def verify(self, tokens: Tensor, layers: Sequence[int] = ()) -> VerifyOutput:
        """Append k tokens (1, k) to the cache in one forward; logits for each of them."""
        if self.cache is None:
            raise RuntimeError("verify() before prefill(): call prefill(inputs) first")
        hidden, layer_hidden = self._forward({"input_ids": tokens.to(self.device)}, layers)
        return VerifyOutput(self.lm_head(hidden).float(), hidden, layer_hidden)

    @torch.inference_mode()
    def verify_tree(self, tokens: Tensor, parents: Sequence[int],
                    layers: Sequence[int] = ()) -> VerifyOutput:
        """Append a token tree's n nodes (1, n), breadth first with node 0 the root, to the cache
        in one forward: node i sits at position cache_len + level(i) and attends to the cache
        and its own ancestors only. Logits for each node; follow with `keep_path`."""
        if self.cache is None:
            raise RuntimeError("verify_tree() before prefill(): call prefill(inputs) first")
        tokens = tokens.to(self.device).view(1, -1)
        parents = check_parents(parents, tokens.shape[1])
        start, n = self.cache_len, len(parents)
        window = sliding_window(self.decoder.config)
        if window is not None and start + n >= window:
            raise RuntimeError(f"a tree of {n} nodes after {start} cached tokens passes the "
                               f"sliding window ({window}); verify chains instead")
        layout = self._layouts.get(parents, self.device, self.dtype)
        deltas = getattr(self.model.model, "rope_deltas", None) if self.info.uses_mrope else None
        inputs = {"input_ids": tokens, "attention_mask": layout.mask(start),
                  "position_ids": layout.positions(start, deltas, self.info.uses_mrope)}
        hidden, layer_hidden = self._forward(inputs, layers)
        self._tree = (start, parents)
        return VerifyOutput(self.lm_head(hidden).float(), hidden, layer_hidden)

    @torch.inference_mode()
    def keep_path(self, path: Sequence[int], n: int) -> None:
        """After a `verify_tree` of n nodes, keep the cache entries of the nodes in `path` (a
        root-to-node path, root first), packed right after the old cache, and drop the rest."""
        if self._tree is None or self.cache_len != self._tree[0] + len(self._tree[1]):
            raise ValueError("keep_path() must follow verify_tree() directly")
        start, parents = self._tree
        if n != len(parents):
            raise ValueError(f"keep_path(n={n}) but the last verify_tree appended "
                             f"{len(parents)} nodes")
        path = check_path(path, parents)
        self._tree = None
        keep = torch.tensor(path, device=self.device) + start  # one index, no host loop
        compact_cache(self.cache, start, keep)

    def rollback(self, n: int) -> None:
        """Drop the last n cache positions (no-op for n == 0)."""
        if n < 0 or n > self.cache_len:
            raise ValueError(f"rollback({n}) needs 0 <= n <= cache_len ({self.cache_len})")
        self._tree = None
        if n > 0:
            self.cache.crop(-n)

    def _forward(self, inputs: dict[str, Any], layers: Sequence[int], *, extra_hooks=(),
                 fresh: bool = False) -> tuple[Tensor, dict[int, Tensor]]:
        layer_hidden: dict[int, Tensor] = {}
        handles = self._layer_hooks(layers, layer_hidden) + [h() for h in extra_hooks]
        kwargs = dict(inputs)
        self._tree = None
        if not fresh and self.info.uses_mrope and "position_ids" not in kwargs:
            # M-RoPE positions come from cache length + rope_deltas
            kwargs.pop("attention_mask", None)
        try:
            out = self.model.model(**kwargs, cache=None if fresh else self.cache, use_cache=True)
        finally:
            for handle in handles:
                handle.remove()
        if fresh:
            self.cache = out.cache
        hidden = out.last_hidden_state  # (1, k, hidden), final-normed
        for i in layers:
            if i == self.num_layers:
                layer_hidden[i] = hidden
        return hidden, layer_hidden

    def _layer_hooks(self, layers: Sequence[int], store: dict[int, Tensor]) -> list:
        handles = []
        for i in dict.fromkeys(layers):
            if not 0 <= i <= self.num_layers:
                raise ValueError(f"layer {i} is outside 0..{self.num_layers} "
                                 "(HF hidden_states indexing)")
            if i == 0:
                def pre(_mod, args, kwargs, _i=i):
                    store[_i] = args[0] if args else kwargs["hidden_states"]
                handles.append(
                    self.decoder.layers[0].register_forward_pre_hook(pre, with_kwargs=True))
            elif i < self.num_layers:
                def post(_mod, _args, output, _i=i):
                    store[_i] = output[0] if isinstance(output, tuple) else output
                handles.append(self.decoder.layers[i - 1].register_forward_hook(post))
        return handles

    def _score_hook(self, input_ids: Tensor, visual_positions: Tensor, out: list[Tensor]):
        """A hook factory on the last layer's attention that scores the visual tokens."""
        attn = self.decoder.layers[-1].self_attn
        after = torch.arange(len(input_ids), device=input_ids.device) > visual_positions.max()
        is_text = after & (input_ids != self.info.image_token_id)
        for tid in self._structural:
            is_text &= input_ids != tid
        text_positions = is_text.nonzero().flatten()

        def hook(module, args, kwargs):
            # (1, seq, hidden), after input norm
            hidden = args[0] if args else kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]  # (1, seq, head_dim)
            out.append(_received_attention(module, hidden, cos, sin, text_positions,
                                           visual_positions))

        return lambda: attn.register_forward_pre_hook(hook, with_kwargs=True)


def _received_attention(attn: nn.Module, hidden: Tensor, cos: Tensor, sin: Tensor,
                        text_positions: Tensor, visual_positions: Tensor) -> Tensor:
    """Mean over heads and text queries of softmax(q k^T) at the visual keys -> (n_visual,)."""
    seq = hidden.shape[1]
    head_dim = attn.head_dim
    if len(text_positions) == 0:
        return torch.zeros(len(visual_positions), device=hidden.device)
    q = attn.q_proj(hidden[:, text_positions]).view(1, len(text_positions), -1, head_dim)
    k = attn.k_proj(hidden).view(1, seq, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms sit before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2).float(), k.transpose(1, 2).float()  # (1, heads, n, head_dim)
    cos, sin = cos.float().unsqueeze(1), sin.float().unsqueeze(1)  # (1, 1, seq, head_dim)
    q = q * cos[:, :, text_positions] + rotate_half(q) * sin[:, :, text_positions]
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # grouped-query attention
    scaling = getattr(attn, "scaling", head_dim**-0.5)
    scores = (q @ k.transpose(-1, -2)) * scaling  # (1, heads, n_text, seq)
    causal = torch.arange(seq, device=hidden.device)[None, :] > text_positions[:, None]
    probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
    return probs[..., visual_positions].mean(dim=(0, 1, 2))  # (n_visual,)


def open_image(image: Any):
    """`image` (a PIL image or the path of an image file) as RGB; a path that is missing, a
    folder, not an image, or too large to decode safely raises one InputError naming it."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    path = Path(image)
    if path.is_dir():
        raise InputError(f"image file {str(path)!r} is a folder; pass the path of a PNG/JPEG "
                         "file")
    if not path.is_file():
        raise InputError(f"image file {str(path)!r} does not exist; "
                         "pass the path of a PNG/JPEG file")
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except Image.DecompressionBombError as exc:
        raise InputError(_too_large(path, exc)) from None
    except UnidentifiedImageError:
        raise InputError(f"image file {str(path)!r} cannot be read as an image (Pillow knows "
                         "no image format in it); pass a PNG or JPEG file") from None
    except (OSError, ValueError, EOFError) as exc:
        why = " ".join(str(getattr(exc, "strerror", None) or exc or "").split())
        raise InputError(f"image file {str(path)!r} cannot be read as an image "
                         f"({type(exc).__name__}{': ' + why if why else ''}); pass an intact "
                         "PNG or JPEG file") from None


# Pillow's message: "Image size (400000000 pixels) exceeds limit of 178956970 pixels, ...".
_BOMB = re.compile(r"\((\d+) pixels\) exceeds limit of (\d+) pixels")


def _too_large(path: Path, exc: Exception) -> str:
    """The one line for an image over Pillow's decompression-bomb limit: its size and the fix."""
    found = _BOMB.search(str(exc))
    size = (f"{int(found[1]):,} pixels, over Pillow's safety limit of {int(found[2]):,}"
            if found else " ".join(str(exc).split()))
    return (f"image file {str(path)!r} is too large to decode ({size}: a decompression-bomb "
            "guard); resize it, e.g. to at most 2048 pixels a side, and pass the smaller file")


def _checkpoint_of(target: str | Path) -> str | Path:
    """What to load for `target`: the cached checkpoint folder of a built-in target (the demo
    target for "builtin", a real-shaped proxy for "proxy-llava"; built on first use), else
    `target` itself."""
    if not is_named_target(target):
        return target
    try:
        from dreams_nas.supernet.builtin.cache import ensure_builtin_target, ensure_proxy_target
        from dreams_nas.supernet.builtin.variants import builtin_variant
    except ImportError as exc:
        raise InputError(f"the built-in target {str(target)!r} is not part of this build; "
                         "pass --target PATH or a hub id") from exc
    if str(target) == BUILTIN:
        return ensure_builtin_target(variant=builtin_variant())
    return ensure_proxy_target(str(target))[0]
