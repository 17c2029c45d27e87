"""A real (small) torch step builder for tests: a Llama target with a KV cache and a sliced
multi-head draft attention, so heads, visual_keep, context and k really change the cost."""

from __future__ import annotations

from collections.abc import Callable

import torch
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.profiler import Step


class ToyBuilder:
    def __init__(self, hidden: int = 64, layers: int = 2, heads: int = 8, visual_tokens: int = 16,
                 seed: int = 0, fail_heads: int | None = None) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=heads,
                          num_key_value_heads=heads, vocab_size=128,
                          max_position_embeddings=4096)
        self.target = LlamaForCausalLM(cfg).eval()
        self.hidden, self.heads, self.visual_tokens = hidden, heads, visual_tokens
        self.head_dim = hidden // heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)  # maximal weights, sliced on use
        self.out = torch.nn.Linear(hidden, hidden, bias=False)
        self.fail_heads = fail_heads  # raise an OOM for this head count (tests the oom path)

    def build(self, key: StepKey) -> Step:
        if key.kind == "draft":
            return Step(self._draft(key))
        if key.kind == "draft_first":  # the draft step after an untimed target verify
            draft = self._draft(key)
            return Step(draft, prepare=self._target(StepKey("verify", key.context_len, 2)))
        return Step(self._target(key))

    @torch.no_grad()
    def _target(self, key: StepKey) -> Callable[[], object]:
        from transformers import DynamicCache

        cache = DynamicCache()
        ids = torch.randint(0, 128, (1, key.context_len))
        self.target(input_ids=ids, cache=cache, use_cache=True)
        new = torch.randint(0, 128, (1, key.k))

        @torch.no_grad()
        def step() -> None:
            self.target(input_ids=new, cache=cache, use_cache=True)
            cache.crop(-key.k)

        return step

    def _draft(self, key: StepKey) -> Callable[[], object]:
        spec = key.spec
        if self.fail_heads is not None and spec.heads == self.fail_heads:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated for the test)")
        h, d = spec.heads, self.head_dim
        kept = key.context_len - self.visual_tokens + round(self.visual_tokens * spec.visual_keep)
        w = self.qkv.weight.detach()
        wq, wk, wv = (w[i * self.hidden: i * self.hidden + h * d].clone() for i in range(3))
        wo = self.out.weight.detach()[:, : h * d].clone()
        memory = torch.randn(1, max(kept, 1), self.hidden)
        keys = (memory @ wk.T).view(1, -1, h, d).transpose(1, 2)  # (1, heads, kept, d)
        values = (memory @ wv.T).view(1, -1, h, d).transpose(1, 2)
        x = torch.randn(1, 1, self.hidden)

        @torch.no_grad()
        def step() -> torch.Tensor:
            q = (x @ wq.T).view(1, 1, h, d).transpose(1, 2)  # (1, heads, 1, d)
            a = torch.nn.functional.scaled_dot_product_attention(q, keys, values)
            return a.transpose(1, 2).reshape(1, 1, h * d) @ wo.T

        return step
