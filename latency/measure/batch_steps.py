"""The steps a profile times at a batch of B requests (`dreams-nas profile --batch-sizes`).

`BatchModelSteps` is `steps.ModelSteps` with every step the batched loop's own
(`supernet.decoding.batch_loop`), all B rows at the key's context length:

* ``decode`` / ``verify``: the target's `RowSteps.chain` over B rows of k new positions, each
  row's length lowered back after every repeat (the rows are filled once per context from one
  prefill, copied into every row);
* ``draft``: one drafting step of every row (`DraftSteps.run` over a `RowDraftCache`);
  ``draft_first``: the cycle's first step, every row's true positions padded to the cycle's
  draft_len + 1 and each row's feature picked at its last true one (`DraftSteps.pick`),
  prepared by the target's batched verify;
* ``verify`` after `precede`'s batched draft steps, as in `ModelSteps`;
* ``cycle``: `batch_loop.batch_cycle` itself, its forwards' time left out
  (`cycle.ForwardTimer`), every row restarted on the context before each repeat.

Batched decoding drafts chains, so no tree key is timed at B > 1 (the plan leaves them out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dreams_nas.latency.measure.cycle import ForwardTimer, TimedSteps
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.profiler import Step
from dreams_nas.latency.measure.steps import ModelSteps, first_positions
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from torch import nn


class BatchModelSteps(ModelSteps):
    """`ModelSteps` at `batch` requests per step (module docstring)."""

    def __init__(self, adapter: Any, supernet: nn.Module, visual_tokens: int, batch: int,
                 seed: int = 0, precede: SubnetSpec | None = None, positions: int = 0) -> None:
        from dreams_nas.supernet.target.rows import RowSteps

        super().__init__(adapter, supernet, visual_tokens, seed=seed, precede=precede,
                         positions=positions)
        self.batch = int(batch)
        self.rows = RowSteps.of(adapter)
        self._filled: int | None = None  # the context the rows hold

    def build(self, key: StepKey) -> Step:
        if key.kind in ("verify_tree", "cycle_tree") or (key.kind == "draft" and key.k > 1):
            raise InputError(f"a {key.kind} step of a token tree is not timed at batch "
                             f"{self.batch}: batched decoding drafts chains")
        return super().build(key)

    def _positions(self, context_len: int) -> int:
        return max(self.positions, context_len + 9)

    @torch.inference_mode()
    def fill_rows(self, context_len: int, force: bool = False) -> Any:
        """Every row holding the prompt of `context_len` positions; the prefill's output."""
        pre = self.prefilled(context_len)
        if force or self._filled != context_len or self.rows.batch != self.batch:
            self.rows.start(self.batch, self._positions(context_len))
            for row in range(self.batch):
                self.rows.admit(row, self.adapter, pre)
            self._filled = context_len
        return pre

    def _ids_rows(self, n: int) -> torch.Tensor:
        return torch.cat([self._ids(n) for _ in range(self.batch)])

    # --- target ------------------------------------------------------------------------
    def _target_step(self, key: StepKey) -> Callable[[], object]:
        rows, k = self.rows, key.k
        self.fill_rows(key.context_len)
        new = self._ids_rows(k)
        back = torch.full((self.batch,), -1, dtype=torch.long, device=self.device)
        counts = [-1] * self.batch

        @torch.inference_mode()
        def step() -> torch.Tensor:
            logits, _ = rows.chain(new)
            rows.keep(back, k, counts)
            return logits.argmax(-1)

        return step

    # --- draft -------------------------------------------------------------------------
    @torch.inference_mode()
    def _draft_steps(self, key: StepKey, width: int = 1, level: bool = False,
                     first_width: int | None = None
                     ) -> tuple[Callable[[], object], Callable[[], object] | None]:
        """The batched draft step of `key` (one position per row), and with `first_width` the
        cycle's first step over that many true positions per row (padded to draft_len + 1)."""
        from dreams_nas.supernet.decoding.draft_steps import DraftSteps
        from dreams_nas.supernet.draft.row_cache import RowDraftCache
        from dreams_nas.supernet.target.static import capacity_for

        assert key.spec is not None and not level
        draft = self._extracted(key.spec)
        steps = DraftSteps.of(draft)
        # the mode the batched loop's drafter runs in: the target's (`DraftSteps.fresh_cache`)
        steps.configure(self.adapter.step_mode, self.rows.backend)
        b, ctx, dev = self.batch, key.context_len, self.device
        memory, own, text = self.draft_prompt(draft, steps, key)
        if memory is not None:  # every row's the same
            from dreams_nas.supernet.draft.state import Memory

            memory = Memory(*(t.expand(b, *t.shape[1:]).contiguous()
                              for t in (memory.keys, memory.values, memory.mask)), padded=True)
        cache = RowDraftCache(b, capacity_for(self._positions(ctx)), dev)
        positions = torch.arange(ctx, device=dev)[own][None].expand(b, -1)
        prev = torch.randn(1, text, self.hidden, generator=self.generator).to(dev, self.dtype)
        draft(self._ids_rows(text), prev.expand(b, -1, -1), positions, memory, cache=cache)
        feature = torch.randn(b, 1, self.hidden, generator=self.generator).to(dev, self.dtype)
        token, position = self._ids_rows(1), torch.full((b, 1), ctx, device=dev)

        @torch.inference_mode()
        def step() -> torch.Tensor:
            _, logits = steps.run(draft, token, feature, position, memory, cache, last=True)
            cache.crop(text)
            return logits.argmax(-1)

        first = None
        if first_width is not None:
            pad_to = key.spec.draft_len + 1
            ids = self._ids_rows(pad_to)
            feats = torch.randn(b, pad_to, self.hidden, generator=self.generator).to(
                dev, self.dtype)
            where = torch.arange(ctx, ctx + pad_to, device=dev)[None].expand(b, -1)
            at = torch.full((b,), first_width - 1, dtype=torch.long, device=dev)

            @torch.inference_mode()
            def first() -> torch.Tensor:
                _, logits = steps.pick(draft, ids, feats, where, memory, cache, at)
                cache.crop(text)
                return logits.argmax(-1)

        return step, first

    def _first_draft_step(self, key: StepKey) -> Step:
        verify, k = self._cycle_verify(key)
        _, first = self._draft_steps(key, first_width=first_positions(k - 1))
        assert first is not None
        return Step(first, prepare=verify)

    # --- the cycle ---------------------------------------------------------------------
    def _cycle(self, key: StepKey) -> Step:
        """`batch_cycle` of a chain of k - 1 drafts by `precede`'s extracted draft, every row
        restarted on the context before each repeat; its forwards' time left out."""
        from dreams_nas.supernet.decoding.batch_dream import BatchDreamDrafter
        from dreams_nas.supernet.decoding.batch_loop import batch_cycle
        from dreams_nas.supernet.decoding.sampling import SamplingConfig

        if key.kind != "cycle":
            raise InputError(f"a {key.kind} step is not timed at batch {self.batch}")
        spec = self.precede or self.supernet.active
        draft = self._extracted(spec)
        timer = ForwardTimer(self.device)
        drafter = BatchDreamDrafter(draft, draft.config.spec)
        rows = _TimedRows(self.rows, timer)
        last = self._ids_rows(1)
        alive = torch.ones(self.batch, dtype=torch.bool, device=self.device)
        draft_len, context = key.k - 1, key.context_len

        @torch.inference_mode()
        def restart() -> None:
            pre = self.fill_rows(context, force=True)
            drafter.start(self.batch, self._positions(context))
            for row in range(self.batch):
                drafter.admit(row, self.adapter, pre)
            drafter.steps = TimedSteps(drafter.one.steps, timer)  # type: ignore[assignment]
            self._filled = None  # the cycle leaves the rows longer: refill before a step

        @torch.inference_mode()
        def run() -> object:
            timer.reset()
            return batch_cycle(rows, drafter, last, draft_len, SamplingConfig(), None,  # type: ignore[arg-type]
                               alive)

        return Step(run, prepare=restart, excluded=timer.ms)


class _TimedRows:
    """`RowSteps` with its batched forward (`chain`) timed; everything else is the rows'."""

    def __init__(self, rows: Any, timer: ForwardTimer) -> None:
        self._rows, self._timer = rows, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows, name)

    def chain(self, *args: Any, **kwargs: Any) -> Any:
        with self._timer.inside():
            return self._rows.chain(*args, **kwargs)
