"""What a kept visual token costs a drafting step, with real VLM geometry: the draft's own
sequence holding the kept visual tokens (the default) vs the cross-attention memory only.

    python benchmarks/bench_visual_context.py [--geometry llava-1.5-7b,qwen2-vl-7b]
        [--dtype bfloat16] [--threads 2] [--repeats 30]

For each geometry a DREAM draft of the target's width (hidden size, heads, MLP, vocabulary: the
LM head is the target's and part of every step) is built with random weights (its cost does
not depend on them) and drafts after a prompt of the geometry's visual tokens plus `--text`
text tokens, as `DreamDrafter` does: the draft's KV cache over its own sequence (the text and,
with visual tokens in the sequence, the kept ones), the cross-attention memory over the text
and the kept visual tokens; one step is a draft forward over one new token, the LM head and the
argmax. Steps of every (design, visual_keep) are interleaved `--repeats` times; medians (ms)
and the range are printed, and the step's share of visual work against keeping none.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

GEOMETRIES = {
    # name: (hidden, heads, head_dim, intermediate, vocab, visual tokens)
    "llava-1.5-7b": (4096, 32, 128, 11008, 32000, 576),
    "llava-next-7b": (4096, 32, 128, 11008, 32064, 2880),
    "qwen2-vl-7b": (3584, 28, 128, 18944, 152064, 1024),
}
KEEPS = (0.25, 0.5, 0.75, 1.0)


def build(geometry: str, dtype: torch.dtype, in_self: bool):
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules

    hidden, heads, head_dim, inner, vocab, _ = GEOMETRIES[geometry]
    config = DraftConfig(hidden_size=hidden, num_heads=heads, head_dim=head_dim,
                         intermediate_size=inner, vocab_size=vocab, inject_layers=(16,),
                         num_target_layers=32, visual_in_self=in_self)
    with torch.device("meta"):
        draft = DreamDraft(config)
        embed, head = torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, vocab, False)
    draft = draft.to_empty(device="cpu").to(dtype)
    embed, head = embed.to_empty(device="cpu").to(dtype), head.to_empty(device="cpu").to(dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in (draft, embed, head):
            for p in module.parameters():
                p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(dtype))
        draft.cross.attn_gate.fill_(0.5)
        draft.cross.mlp_gate.fill_(0.5)
    draft.attach(SharedTargetModules(embed, head))
    return draft.eval()


@torch.inference_mode()
def step_fn(draft, geometry: str, keep: float, text: int, dtype: torch.dtype):
    """One drafting step of the subnet (all heads, `keep`) after the prompt's prefill."""
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.draft.state import DraftCache

    hidden, heads, _, _, vocab, n_vis = GEOMETRIES[geometry]
    ctx = 1 + n_vis + text
    gen = torch.Generator().manual_seed(1)
    visual = torch.zeros(1, ctx, dtype=torch.bool)
    visual[0, 1:1 + n_vis] = True
    scores = torch.rand(1, ctx, generator=gen)
    spec = SubnetSpec(heads, keep, 16, 1)
    draft.set_active(spec)
    memory = draft.memory(torch.randn(1, ctx, hidden, generator=gen).to(dtype), visual, scores)
    own = draft.draft_positions(visual, scores)[0]
    n = int(own.sum())
    positions = torch.arange(ctx)[own][None]
    cache = DraftCache()
    ids = torch.randint(0, vocab, (1, n), generator=gen)
    out = draft(ids, torch.randn(1, n, hidden, generator=gen).to(dtype), positions, memory,
                cache=cache)
    token = torch.randint(0, vocab, (1, 1), generator=gen)
    feature = out.feature[:, -1:]
    position = torch.tensor([[ctx]])

    def step() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            result = draft(token, feature, position, memory, cache=cache)
            draft.logits(result.feature[:, -1]).argmax(-1)
            cache.crop(n)
        return time.perf_counter() - start

    return step, n, memory.length


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="llava-1.5-7b,qwen2-vl-7b")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--text", type=int, default=64, help="text tokens of the prompt")
    args = parser.parse_args(argv)
    unknown = [g for g in args.geometry.split(",") if g not in GEOMETRIES]
    if unknown:
        print(f"error: unknown geometry {unknown}; one of {', '.join(GEOMETRIES)}",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    for geometry in args.geometry.split(","):
        cases = {}
        for in_self in (True, False):
            draft = build(geometry, dtype, in_self)
            for keep in KEEPS if in_self else (1.0,):
                cases[(in_self, keep)] = step_fn(draft, geometry, keep, args.text, dtype)
        for fn, _, _ in cases.values():  # warm-up
            fn()
        times: dict = {key: [] for key in cases}
        for _ in range(args.repeats):
            for key, (fn, _, _) in cases.items():
                times[key].append(fn() * 1e3)
        base = statistics.median(times[(False, 1.0)])
        n_vis = GEOMETRIES[geometry][5]
        print(f"\n{geometry}: {n_vis} visual + {args.text} text tokens, {args.dtype}, "
              f"{args.threads} thread(s), median of {args.repeats} interleaved steps")
        print("| design | visual_keep | own sequence | memory | step ms, median (range) | "
              "vs memory only |")
        print("|---|---:|---:|---:|---|---:|")
        for (in_self, keep), (_, own, mem) in cases.items():
            ms = times[(in_self, keep)]
            name = "visual in own sequence" if in_self else "memory only"
            print(f"| {name} | {keep:g} | {own} | {mem} | {statistics.median(ms):.1f} "
                  f"({min(ms):.1f}-{max(ms):.1f}) | {statistics.median(ms) / base - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
