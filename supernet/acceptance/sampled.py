"""Acceptance at temperature > 0: real seeded speculative runs (method "sampled").

Above temperature 0 the accepted length is random, so a teacher-forced replay does not apply;
each spec is decoded for real through the engine's loop with the DREAM drafter, one seeded
generator per prompt (the same seeds for every spec, so specs are compared on the same draws
of the target's side as far as their paths agree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.acceptance.teacher_forced import accept_rates, dtype_name, pooled_tau
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.target.adapter import TargetAdapter
from torch import Tensor


class SampledScorer:
    def __init__(self, adapter: TargetAdapter, draft: DreamDraft,
                 prompts: Sequence[Mapping[str, Tensor]], *, supernet_hash: str, dataset_id: str,
                 temperature: float, max_new_tokens: int = 64, n_boot: int = 1000,
                 seed: int = 0) -> None:
        if temperature <= 0:
            raise InputError(f"temperature={temperature}: sampled scoring needs a temperature > 0 "
                             "(temperature 0 is scored teacher-forced)")
        if not prompts:
            raise InputError("no evaluation prompts to score acceptance on; "
                             "give a non-empty --data")
        self.adapter, self.draft, self.prompts = adapter, draft, list(prompts)
        self.supernet_hash, self.dataset_id = supernet_hash, dataset_id
        self.sampling = SamplingConfig(temperature=float(temperature))
        self.max_new_tokens, self.n_boot, self.seed = int(max_new_tokens), int(n_boot), int(seed)

    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        return [self._score_one(spec) for spec in specs]

    def _score_one(self, spec: SubnetSpec) -> AcceptanceRow:
        cycles = []
        for i, prompt in enumerate(self.prompts):
            gen = torch.Generator(device=self.adapter.device).manual_seed(self.seed * 100_003 + i)
            out = generate(self.adapter, dict(prompt), DreamDrafter(self.draft, spec),
                           shape=spec.shape, max_new_tokens=self.max_new_tokens,
                           sampling=self.sampling, generator=gen)
            cycles.append((list(out.stats.cycle_lengths), list(out.stats.proposed)))
        tau, lo, hi = pooled_tau(cycles, self.n_boot, np.random.default_rng(self.seed))
        lengths = [n for c in cycles for n in c[0]]
        offered = [p for c in cycles for p in c[1]]
        context = int(round(float(np.mean([int(p["input_ids"].shape[-1]) for p in self.prompts]))))
        return AcceptanceRow(
            spec=spec, tau=tau, tau_lo=lo, tau_hi=hi, supernet_hash=self.supernet_hash,
            dataset_id=self.dataset_id, temperature=self.sampling.temperature,
            dtype=dtype_name(self.adapter), max_new_tokens=self.max_new_tokens, method="sampled",
            n_prompts=len(self.prompts), n_tokens=int(sum(lengths)), context_len=context,
            accept_rates=tuple(accept_rates(lengths, offered, spec.draft_len)),
        )
