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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.targets import is_named_target
from dreams_nas.supernet.ops.linear import use_fast_linears
from dreams_nas.supernet.target.families import (
    FamilyInfo,
    architecture_hash,
    detect_family,
    structural_token_ids,
    text_decoder,
)
from dreams_nas.supernet.target.hooks import layer_hooks
from dreams_nas.supernet.target.images import open_image
from dreams_nas.supernet.target.static import STEP_MODES, StaticSteps
from dreams_nas.supernet.target.tree_attention import (
    LayoutCache,
    check_parents,
    check_path,
    compact_cache,
    sliding_window,
    tree_support,
)
from dreams_nas.supernet.target.visual_scores import score_hook
from torch import Tensor, nn


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
        # the token ids that are not text queries when visual tokens are scored
        self._text_ids_excluded = (self.info.image_token_id,
                                   *structural_token_ids(self.tokenizer))
        self.cache = None
        self.static: StaticSteps | None = None  # `use_steps`: steps over a static cache
        self._layouts = LayoutCache()
        self._tree: tuple[int, tuple[int, ...]] | None = None  # (cache_len before, parents)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_model(cls, model: nn.Module, processor: Any = None,
                   tokenizer: Any = None) -> TargetAdapter:
        return cls(model, processor, tokenizer)

    @classmethod
    def load(cls, target: str | Path, *, device: str | torch.device = "cpu",
             dtype: torch.dtype | None = None, target_id: str | None = None) -> TargetAdapter:
        """Load from a local checkpoint folder or a hub id; nothing is built or trained here.

        A named target (``builtin``, ``proxy-*``) is refused: resolve it to its folder first
        (`supernet.builtin.resolve.resolve_target`, which builds it on first use) and pass the
        name as `target_id`, what run.json records (None: `target` itself)."""
        from dreams_nas.supernet.target.loading import load_model_and_processor

        loaded = load_model_and_processor(_checkpoint(target), device=device, dtype=dtype)
        return cls(loaded.model, loaded.processor, loaded.tokenizer,
                   target_id=str(target) if target_id is None else target_id,
                   path=loaded.source, processor_error=loaded.processor_error)

    @staticmethod
    def architecture(target: str | Path) -> str:
        """`architecture_hash` of a target from its config alone (no weights are loaded): a
        command can refuse a mismatch before the slow load. A named target is refused, as by
        `load`: resolve it first (`supernet.builtin.resolve.resolve_target`)."""
        from dreams_nas.supernet.target.loading import load_config

        return architecture_hash(load_config(_checkpoint(target)))

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

    def use_steps(self, mode: str, backend: str | None = None) -> None:
        """How decoding steps run from the next prefill on: ``dynamic`` (HF's growing cache,
        eager), ``static`` (a static cache, eager) or ``compiled`` (a static cache, each step
        compiled once per shape; `backend`: torch.compile's, None = inductor). The outputs
        are the same (`supernet.target.static`)."""
        if mode not in STEP_MODES:
            raise ValueError(f"step mode {mode!r}; pick one of {', '.join(STEP_MODES)}")
        if self.static is not None:
            self.static.close()
        self.static = None if mode == "dynamic" else StaticSteps(
            self.model, self.decoder, self.lm_head, compiled=mode == "compiled",
            mrope=self.info.uses_mrope, backend=backend)
        self.cache = None

    @property
    def step_mode(self) -> str:
        if self.static is None:
            return "dynamic"
        return "compiled" if self.static.compiled else "static"

    # ----------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def cache_len(self) -> int:
        if self.static is not None and self.cache is not None:
            return self.static.length  # the host's count: no wait for the device
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
                all_logits: bool = False, reserve: int = 0) -> PrefillOutput:
        """Run the prompt, start a fresh KV cache, and return what a draft needs. `reserve`:
        the positions a static cache keeps free after the prompt (`use_steps`)."""
        inputs = self._to_device(inputs)
        input_ids = inputs["input_ids"]  # (1, seq)
        if input_ids.shape[0] != 1:
            raise InputError(f"batch size {input_ids.shape[0]} is not supported; "
                             "the adapter decodes one sequence")
        visual_positions = (input_ids[0] == self.info.image_token_id).nonzero().flatten()
        scores: list[Tensor] = []
        extra = ([score_hook(self.decoder.layers[-1].self_attn, input_ids[0], visual_positions,
                              self._text_ids_excluded, scores)]
                 if len(visual_positions) else [])
        if self.info.uses_mrope:
            self.model.model.rope_deltas = None  # recomputed from this prompt (stale otherwise)
        hidden, layer_hidden = self._forward(inputs, layers, extra_hooks=extra,
                                             fresh=input_ids.shape[1] + reserve)
        if self.static is not None:
            self.static.started(input_ids.shape[1], getattr(self.model.model, "rope_deltas",
                                                            None) if self.info.uses_mrope else None)
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
        if self.static is not None:
            self._tree = None
            return VerifyOutput(*self.static.chain(tokens.to(self.device), layers))
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
        if self.static is not None:
            out = VerifyOutput(*self.static.tree(tokens, layout.levels, layout.bias, layers))
            self._tree = (start, parents)
            return out
        deltas = getattr(self.model.model, "rope_deltas", None) if self.info.uses_mrope else None
        inputs = {"input_ids": tokens, "attention_mask": layout.mask(start),
                  "position_ids": layout.positions(start, deltas, self.info.uses_mrope)}
        hidden, layer_hidden = self._forward(inputs, layers)
        self._tree = (start, parents)
        return VerifyOutput(self.lm_head(hidden).float(), hidden, layer_hidden)

    @torch.inference_mode()
    def keep_path(self, path: Sequence[int], n: int, index: Tensor | None = None) -> None:
        """After a `verify_tree` of n nodes, keep the cache entries of the nodes in `path` (a
        root-to-node path, root first), packed right after the old cache, and drop the rest.
        `index`: `path` already on the device (no copy of it here)."""
        if self._tree is None or self.cache_len != self._tree[0] + len(self._tree[1]):
            raise ValueError("keep_path() must follow verify_tree() directly")
        start, parents = self._tree
        if n != len(parents):
            raise ValueError(f"keep_path(n={n}) but the last verify_tree appended "
                             f"{len(parents)} nodes")
        path = check_path(path, parents)
        self._tree = None
        keep = (torch.tensor(path, device=self.device) if index is None else index) + start
        if self.static is not None:
            self.static.compact(start, keep)
        else:
            compact_cache(self.cache, start, keep)

    def rollback(self, n: int) -> None:
        """Drop the last n cache positions (no-op for n == 0)."""
        if n < 0 or n > self.cache_len:
            raise ValueError(f"rollback({n}) needs 0 <= n <= cache_len ({self.cache_len})")
        self._tree = None
        if n > 0 and self.static is not None:
            self.static.rollback(n)
        elif n > 0:
            self.cache.crop(-n)

    def _fresh_cache(self, positions: int) -> Any:
        """The cache a prefill of up to `positions` positions starts: a static one
        (`use_steps`), else the model's own (None), except under sliding-window attention,
        whose cache layers drop what passes the window and then cannot roll back a rejected
        draft; there every layer keeps every position and the model's sliding mask keeps
        attention within the window, as it does for a cache of the full context."""
        if self.static is not None:
            return self.static.fresh(positions)
        if sliding_window(self.decoder.config) is None:
            return None
        from transformers import DynamicCache

        return DynamicCache()

    def _forward(self, inputs: dict[str, Any], layers: Sequence[int], *, extra_hooks=(),
                 fresh: int = 0) -> tuple[Tensor, dict[int, Tensor]]:
        """One forward of the decoder; `fresh` (the positions to hold) starts a new cache."""
        layer_hidden: dict[int, Tensor] = {}
        handles = layer_hooks(self.decoder.layers, layers, layer_hidden)
        handles += [h() for h in extra_hooks]
        kwargs = dict(inputs)
        self._tree = None
        if not fresh and self.info.uses_mrope and "position_ids" not in kwargs:
            # M-RoPE positions come from cache length + rope_deltas
            kwargs.pop("attention_mask", None)
        try:
            cache = self._fresh_cache(fresh) if fresh else self.cache
            out = self.model.model(**kwargs, cache=cache, use_cache=True)
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


def _checkpoint(target: str | Path) -> str | Path:
    """`target` itself: a checkpoint folder or hub id. A named target is refused: building it
    is the resolver's work, never a side effect of loading."""
    if is_named_target(target):
        raise InputError(
            f"{str(target)!r} names a built-in or proxy target, not a checkpoint folder or hub id; "
            "resolve it first (dreams_nas.supernet.builtin.resolve.resolve_target, as the "
            "commands do for --target) and load the folder it returns")
    return target
