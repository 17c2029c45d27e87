"""The steps that are timed, built from real models.

* ``draft``: one step of the subnet *extracted* from the DREAM-S supernet (sliced weights and
  only its `depth` layers a side, so fewer heads, MLP channels and layers really cost less) --
  embed the last token, fuse with the previous feature, the draft's 2 * depth + 1 blocks over
  its own KV cache and the cross-attention memory of the kept visual + text positions, the
  draft's `logits` (the target's LM head, only its rows of the draft's vocabulary when
  `draft_vocab` < 1: `DreamDraft.logits`), argmax. The memory's keys/values are computed once
  per request at prefill, so they are built before timing, as the draft's cache is. Timed
  back to back (with `chain_drafts`, prepared by the target's verify and the first draft step:
  a little dearer, `benchmarks/bench_draft_chain.py`). The draft steps are the loop's own
  (`DraftSteps`): compiled when the adapter's steps are (`use_steps`), over caches of one
  capacity (`positions`), the first step padded to draft_len + 1 as the loop pads it.
* ``draft_first``: the cycle's first draft step, over the previous cycle's accepted tokens
  (`first_positions`), with a `prepare` (run untimed before every repeat by `measure`) that
  runs the target's verify over the cycle's max_draft_len + 1 positions at the same context length
  and rolls it back -- what precedes the first draft step of every cycle.
* ``decode`` / ``verify``: the target's forward over k = 1 or k new positions on a KV cache
  already holding `context_len` positions, cropped back after each repeat (the cache is filled
  once per context and kept for every step at that context: `ModelSteps.prefilled`).
  ``decode`` is timed back to back, as plain decoding runs it. In speculative decoding every
  verify follows the cycle's draft steps, which push the target's weights out of the CPU
  caches; so when the builder is given a `precede` subnet, a ``verify`` repeat is prepared
  (untimed) by that subnet's draft steps at the same context, as the loop runs it.
* ``cycle`` / ``cycle_tree``: the speculative loop's per-cycle work outside the forwards, with
  `precede`'s extracted draft (`dreams_nas.latency.measure.cycle`).

Latency does not depend on the weights' values, so an untrained supernet built from the
target's config times the same as the trained one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.prefills import KeptPrefills
from dreams_nas.latency.measure.profiler import Step
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.core.tree import TokenTree
from torch import nn

# How this program runs the steps it times, raised whenever a change makes a timed step cost
# differently: 1, every profile before it was recorded; 2, the draft's weights kept per subnet;
# 3, compiled steps skip dynamo's guards once warm (`static.warm_call`); 4, inductor's C++
# wrapper on the CPU (`static.compile_options`), a static first draft step's LM head over its
# last true position only. A profile records it (predictor.json); a search on another warns.
STEP_REVISION = 4


def first_positions(draft_len: int) -> int:
    """Positions the first draft step of a cycle is timed over.

    That step reads the previous cycle's accepted tokens plus the new one: 1 .. draft_len + 1
    positions, tau on average. Past a few positions the width barely changes its cost, so it
    is timed over the middle of the range, (draft_len + 1) // 2 (at least 1).
    """
    return max(1, (draft_len + 1) // 2)


def text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def visual_tokens_of(config: Any) -> int:
    """Visual tokens one image occupies in the target's prompt (0 for a text-only model)."""
    seq = getattr(config, "image_seq_length", None)
    vision = getattr(config, "vision_config", None)
    if (vision is not None and getattr(vision, "image_size", None)
            and getattr(vision, "patch_size", None)):
        patches = (int(vision.image_size) // int(vision.patch_size)) ** 2
        strategy = getattr(config, "vision_feature_select_strategy", "default")
        computed = patches + (1 if strategy == "full" else 0)
        if seq is None or seq > computed * 4:  # llava's 576 default is for 336px CLIP-L/14
            return computed
    return int(seq or 0)


def default_context_lengths(visual_tokens: int) -> list[int]:
    """Prompt = image + question, growing with the answer: image + 16 .. 256 text tokens."""
    return [visual_tokens + t for t in (16, 48, 96, 160, 256)]


def build_supernet(target: nn.Module, space: SearchSpace, config: Any = None,
                   seed: int = 0) -> nn.Module:
    """An (untrained, seeded) DREAM-S supernet for `target` covering `space` (its heads, its
    deepest subnet's layers, its MLP widths, its draft vocabularies), or one with `config` (a
    DraftConfig, e.g. the trained supernet's), which must cover the space: its cost is what is
    timed, not its weights (nor its token frequency order: an untrained one ranks the ids as
    they come, and a draft vocabulary costs the same whichever rows it keeps)."""
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules

    shared = SharedTargetModules(embed_tokens=target.get_input_embeddings(),
                                 lm_head=target.get_output_embeddings())
    if config is None:
        config = DraftConfig.for_target(text_config(target.config),
                                        inject_layers=space.inject_layer,
                                        num_heads=max(space.heads),
                                        num_layers=max(space.depth), mlp_shares=space.mlp,
                                        vocab_shares=space.draft_vocab)
    missing = [h for h in space.heads if h > config.num_heads]
    if missing:
        raise InputError(f"the space's heads {missing} exceed the supernet's "
                         f"{config.num_heads} heads")
    deep = [d for d in space.depth if d > config.num_layers]
    if deep:
        raise InputError(f"the space's depths {deep} exceed the supernet's {config.num_layers} "
                         "layer(s) a side; search depths up to that, or train a deeper supernet")
    widths = [m for m in space.mlp if m not in config.mlp_shares]
    if widths:
        raise InputError(f"the space's MLP widths {widths} are not ones the supernet was "
                         f"trained at {list(config.mlp_shares)}; search those, or train it at "
                         "these widths")
    vocabs = [n for n in space.draft_vocab if n not in config.vocab_shares]
    if vocabs:
        raise InputError(f"the space's draft vocabularies {vocabs} are not shares the supernet "
                         f"offers {list(config.vocab_shares)}; search those, or train it with "
                         "`--draft-vocab` at these shares")
    param = next(target.parameters())
    draft = DreamDraft.initialised(config, shared, seed)
    return draft.to(device=param.device, dtype=param.dtype).eval()


class ModelSteps:
    """`StepBuilder` over the engine's `TargetAdapter` and a DREAM-S supernet on one device.

    The target steps run exactly what speculative decoding runs: ``adapter.verify(tokens,
    layers)`` on the adapter's KV cache (decode: one token, no hidden states requested;
    verify: k tokens and the hidden states of the layer the draft reads), then
    ``adapter.rollback(k)``.
    """

    def __init__(self, adapter: Any, supernet: nn.Module, visual_tokens: int, seed: int = 0,
                 precede: SubnetSpec | None = None, trees: Sequence[Sequence[int]] = (),
                 chain_drafts: bool = False, positions: int = 0) -> None:
        self.adapter, self.supernet = adapter, supernet.eval()
        # static steps (`adapter.use_steps`): the positions every cache is made for, whatever
        # the context (one capacity, so each step's shape compiles once)
        self.positions = positions
        self.device, self.dtype = adapter.device, adapter.dtype
        self.visual_tokens = int(visual_tokens)
        self.vocab = int(adapter.vocab_size)
        self.hidden = int(adapter.hidden_size)
        self.avoid = {adapter.info.image_token_id}
        self.verify_layers = (max(supernet.config.inject_layers),)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        # The last extracted subnet, keyed by its architecture (`SubnetSpec.arch`).
        self._compact: tuple[SubnetSpec, nn.Module] | None = None
        # the target's prefilled caches, one per context length (`latency.measure.prefills`)
        self.prefills = KeptPrefills(adapter)
        # The subnet whose draft_len draft steps run (untimed) before every verify repeat.
        self.precede = precede
        # A tree of each size the space holds: what a ``verify_tree`` key of k positions runs.
        self.trees = {TokenTree(tuple(t)).nodes + 1: TokenTree(tuple(t)) for t in trees}
        # A ``draft`` repeat prepared by a verify and the first draft step (module docstring).
        self.chain_drafts = chain_drafts

    def build(self, key: StepKey) -> Step:
        """The step of `key`; a ``draft_first`` step is prepared by the target's verify pass
        and a verify by `precede`'s draft steps, which the profiler runs untimed before every
        repeat."""
        if key.context_len <= self.visual_tokens:
            raise InputError(
                f"context length {key.context_len} leaves no text after the {self.visual_tokens} "
                f"visual tokens; use --context-lengths above {self.visual_tokens}"
            )
        if key.kind == "draft":
            if self.chain_drafts:
                return self._chained_draft_step(key)
            return Step(self._draft_step(key, width=key.k, level=key.k > 1))
        if key.kind == "draft_first":
            return self._first_draft_step(key)
        if key.kind in ("cycle", "cycle_tree"):
            return self._cycle(key)
        if key.kind in ("verify", "verify_tree") and self.precede is not None:
            return self._verify_after_draft(key)
        return Step(self._target_step(key))

    def _ids(self, n: int) -> torch.Tensor:
        ids = torch.randint(0, self.vocab, (1, n), generator=self.generator)
        for bad in self.avoid - {None}:
            ids[ids == bad] = 0  # plain text: no image placeholder without pixels
        return ids.to(self.device)

    # --- target ------------------------------------------------------------------------
    def prefilled(self, context_len: int) -> Any:
        """Leave the target's KV cache holding `context_len` positions; the prefill's output
        (with the hidden states of every layer the supernet reads, so that a cycle's drafter
        starts from it too). Every target step rolls back what it appends and a cache's cost
        depends on its length, not on which tokens (or image positions) it holds, so the cache
        of each context is filled once and kept (`KeptPrefills`): one prefill per context
        rather than one per step and pass (at 600 positions of a 0.4B target in bfloat16 on a
        CPU a prefill takes seconds)."""
        return self.prefills.get(context_len, self._prefill)

    def _prefill(self, context_len: int) -> Any:
        return self.adapter.prefill({"input_ids": self._ids(context_len)},
                                    layers=tuple(self.supernet.config.inject_layers),
                                    reserve=max(0, self.positions - context_len))

    def _target_step(self, key: StepKey) -> Callable[[], object]:
        adapter, k = self.adapter, key.k
        self.prefilled(key.context_len)
        assert adapter.cache_len == key.context_len
        new = self._ids(k)
        layers = () if key.kind == "decode" else self.verify_layers
        parents = self._tree_of(k).parents if key.kind == "verify_tree" else None

        def step() -> torch.Tensor:
            if parents is None:
                out = adapter.verify(new, layers)  # logits (1, k, vocab)
            else:  # the tree's mask and per-node positions, as the loop verifies a tree
                out = adapter.verify_tree(new, parents, layers)
            adapter.rollback(k)
            return out.logits.argmax(-1)

        return step

    def _cycle(self, key: StepKey) -> Step:
        """One speculative cycle of `key` (a chain of k - 1 drafts, or the space's tree of
        k - 1 nodes) drafted by `precede` (else the supernet's active subnet), its forwards'
        time left out of the sample."""
        from dreams_nas.latency.measure.cycle import cycle_step

        spec = self.precede or self.supernet.active
        tree = self._tree_of(key.k) if key.kind == "cycle_tree" else None
        draft = self._extracted(spec)
        return cycle_step(self.adapter, draft, key, self._ids(key.context_len),
                          self._ids(1), tree=tree, pre=self.prefilled(key.context_len))

    def _tree_of(self, k: int) -> TokenTree:
        """The space's tree of k - 1 nodes (else a root with k - 1 children)."""
        return self.trees.get(k) or TokenTree((k - 1,))

    def _verify_after_draft(self, key: StepKey) -> Step:
        """The verify step of `key`, prepared by `precede`'s draft_len draft steps."""
        assert self.precede is not None
        steps = max(1, self.precede.draft_len)
        draft = self._draft_step(StepKey("draft", key.context_len, 1, self.precede))
        verify = self._target_step(key)

        def drafting() -> None:
            for _ in range(steps):
                draft()

        return Step(verify, prepare=drafting)

    # --- draft -------------------------------------------------------------------------
    def _chained_draft_step(self, key: StepKey) -> Step:
        """The draft step of `key` (one position, or a tree level of `key.k` nodes) as a cycle
        runs its later steps: each repeat is prepared (untimed) by what precedes it in the loop
        -- the target's verify over the canonical spec's draft_len + 1 positions, then the
        cycle's first draft step on the *same* draft cache and cross-attention memory (which
        the verify evicted from the CPU caches and the first step brings back, as in the
        loop) -- not back to back (`chain_drafts`)."""
        verify, k = self._cycle_verify(key)
        step, first = self._draft_steps(key, width=key.k, level=key.k > 1,
                                        first_width=first_positions(k - 1))
        assert first is not None

        def chain() -> None:
            verify()
            first()

        return Step(step, prepare=chain)

    def _first_draft_step(self, key: StepKey) -> Step:
        """The draft step of `key` over `first_positions(draft_len)` positions, prepared by the
        target's verify over the canonical spec's draft_len + 1 positions (the space's largest
        draft_len; 8 without a spec)."""
        verify, k = self._cycle_verify(key)
        return Step(self._draft_step(key, width=first_positions(k - 1)), prepare=verify)

    def _cycle_verify(self, key: StepKey) -> tuple[Callable[[], object], int]:
        """The target's verify that opens a cycle of `key`'s draft steps, and its positions k:
        the canonical spec's draft_len + 1 (the space's largest draft_len; 8 without a spec)."""
        assert key.spec is not None
        k = key.spec.draft_len + 1 if key.spec.draft_len else 8
        return self._target_step(StepKey("verify", key.context_len, max(2, k))), k

    def _extracted(self, spec: SubnetSpec) -> nn.Module:
        from dreams_nas.supernet.draft.extract import extract

        ident = spec.arch  # heads, visual_keep, inject_layer, the sizes: what extract cuts
        if self._compact is None or self._compact[0] != ident:
            self._compact = None  # free the previous subnet first
            # built as the engine builds a draft, outside inference mode (the timed steps run
            # inside it): its buffers, e.g. the `vocab_order` its sliced LM head is cached by,
            # stay ordinary tensors with a version counter
            with torch.inference_mode(False):
                self._compact = (ident, extract(self.supernet, spec))
        return self._compact[1]

    def _draft_step(self, key: StepKey, width: int = 1, level: bool = False
                    ) -> Callable[[], object]:
        """One draft forward over `width` new positions (1: a step within the cycle), the
        draft's `logits` on the last (the LM head's rows of its vocabulary), argmax; the
        draft's cache is cropped back after each call. A tree `level`: the `width` nodes of one
        depth, each seeing the cache and itself (its ancestors sit in the cache), the logits of
        every node and each node's children ranked, as `DreamDrafter.propose_tree` drafts a
        level."""
        return self._draft_steps(key, width, level)[0]

    @torch.inference_mode()
    def _draft_steps(self, key: StepKey, width: int = 1, level: bool = False,
                     first_width: int | None = None
                     ) -> tuple[Callable[[], object], Callable[[], object] | None]:
        """`_draft_step`'s step, and with `first_width` a first draft step over that many
        positions on the same cache and memory (both crop the cache back to the prompt)."""
        from dreams_nas.supernet.decoding.draft_steps import DraftSteps
        from dreams_nas.supernet.target.static import capacity_for

        assert key.spec is not None
        draft = self._extracted(key.spec)
        steps = DraftSteps.of(draft)  # the loop's steps: eager, or compiled as the target's
        static = getattr(self.adapter, "static", None)
        steps.configure(getattr(self.adapter, "step_mode", "dynamic") if static else "dynamic",
                        static.backend if static else None)
        ctx, dev = key.context_len, self.device
        memory, own, text = self.draft_prompt(draft, steps, key)
        cache = (steps.fresh_cache(self.adapter, key.spec) if steps.mode == "dynamic" else
                 steps.static_cache(capacity_for(max(self.positions, ctx + width)), key.spec))
        positions = torch.arange(ctx, device=dev)[own][None]  # (1, text)
        prev = torch.randn(1, text, self.hidden, generator=self.generator).to(dev, self.dtype)
        out = draft(self._ids(text), prev, positions, memory, cache=cache)
        token = self._ids(width)
        if width == 1:
            feature = out.feature[:, -1:]  # (1, 1, hidden)
        else:  # the accepted tokens' target features, as the loop feeds them
            feature = torch.randn(1, width, self.hidden, generator=self.generator).to(
                dev, self.dtype)
        position = torch.arange(ctx, ctx + width, device=dev)[None]
        first = None if first_width is None else self._first_on(
            steps, draft, memory, cache, text, ctx, first_width, key.spec.draft_len + 1)
        if level:
            position = torch.full((1, width), ctx, device=dev)
            mask = torch.eye(width, dtype=torch.bool, device=dev)

            @torch.inference_mode()
            def level_step() -> torch.Tensor:
                _, logits = steps.run(draft, token, feature, position, memory, cache,
                                      tree_mask=mask)  # (1, width, vocab)
                cache.crop(text)
                return logits[0].sort(dim=-1, descending=True, stable=True).indices[:, :4]

            return level_step, first

        return draft_forward(steps, draft, (token, feature, position), memory, cache, text), first

    def draft_prompt(self, draft: nn.Module, steps: Any, key: StepKey) -> tuple[Any, Any, int]:
        """A prompt of `key`'s context (BOS, the visual tokens, text) for `draft`: its memory
        (padded as `steps` pad it), the positions of the draft's own sequence (bool: the text
        and, where the draft keeps them there, the kept visual tokens) and their count."""
        assert key.spec is not None
        n_vis, ctx, dev = self.visual_tokens, key.context_len, self.device
        visual_mask = torch.zeros(1, ctx, dtype=torch.bool, device=dev)
        visual_mask[0, 1:1 + n_vis] = True
        scores = torch.rand(1, ctx, generator=self.generator).to(dev)
        hidden = torch.randn(1, ctx, self.hidden, generator=self.generator).to(dev, self.dtype)
        memory = draft.memory(hidden, visual_mask, scores)
        expected = ctx - n_vis + (math.ceil(key.spec.visual_keep * n_vis - 1e-9) if n_vis else 0)
        assert memory is None or abs(memory.length - expected) <= 1
        memory = steps.padded(memory) if memory is not None else None
        own = draft.draft_positions(visual_mask, scores)[0]
        return memory, own, int(own.sum())

    def _first_on(self, steps: Any, draft: nn.Module, memory: Any, cache: Any, text: int,
                  ctx: int, width: int, pad_to: int) -> Callable[[], object]:
        """A first draft step over `width` positions (static steps: padded to `pad_to`, as the
        loop runs it) on `draft`'s cache and memory, cropped back to the `text` prompt after."""
        dev = self.device
        token = self._ids(width)
        feature = torch.randn(1, width, self.hidden, generator=self.generator).to(dev, self.dtype)
        position = torch.arange(ctx, ctx + width, device=dev)[None]
        return draft_forward(steps, draft, (token, feature, position), memory, cache, text, pad_to)


def draft_forward(steps: Any, draft: nn.Module, inputs: tuple[torch.Tensor, ...], memory: Any,
                  cache: Any, text: int, pad_to: int | None = None) -> Callable[[], torch.Tensor]:
    """The loop's draft step (`steps`, its `DraftSteps`; with `pad_to`, a cycle's first) over
    `inputs` (token, feature, position): argmax of the last logits, the cache cropped to `text`."""
    token, feature, position = inputs

    @torch.inference_mode()
    def step() -> torch.Tensor:
        if pad_to is None:
            _, logits = steps.run(draft, token, feature, position, memory, cache, last=True)
        else:
            _, logits = steps.first(draft, token, feature, position, memory, cache, text, pad_to)
        cache.crop(text)
        return logits.argmax(-1)

    return step
