"""A draft step's cost over an elastic space, at a target's geometry, with random weights.

    python benchmarks/bench_draft_range.py --geometry builtin       # the built-in target's draft
    python benchmarks/bench_draft_range.py --geometry proxy-llava   # LLaVA-1.5's image geometry
        [--depth 3] [--mlp 0.25,0.5,1] [--context 700] [--visual 576] [--dtype float32]
        [--threads 1] [--repeats 200] [--rounds 3] [--compile on]

What the elastic dimensions do to the cost of one draft step needs no trained draft: the step's
work is set by the shapes. This builds the supernet draft of a target geometry (the built-in
target's, or `proxy-llava`'s: hidden 1024, 16 heads of 64, MLP 2816, a 32,000-token head; the
visual tokens of a 336-pixel image), extracts every subnet of (heads in quarters, visual_keep
0.25 / 1, every depth, every MLP share, and the draft vocabularies of the default space: a
quarter beside the whole for a vocabulary of 16,000 tokens or more), starts it on a prompt of
`--context` positions of which `--visual` are visual (the target's hidden states random), and
times the step the profile's ``draft`` kind prices: one forward over one new position with the
drafter's cache and memory, the LM head, the argmax and the cache crop (`--repeats` samples
after warm-ups, median). The subnets are timed in `--rounds` shuffled passes, each subnet's
figure the median of its passes. With `--compile on` the step is the loop's compiled one (a
static cache of the context's capacity, the memory padded to a multiple of 256 positions, each
shape compiled by inductor in the warm-up, later calls past dynamo's guards), as a compiled
profile times it. Printed: each depth's fastest and slowest subnet, and the space's range
(slowest / fastest), then one line of JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch

GEOMETRIES = {
    # (hidden, heads, head_dim, intermediate, vocab, target layers)
    "builtin": (128, 4, 32, 384, 132, 16),
    "proxy-llava": (1024, 16, 64, 2816, 32_000, 20),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), default="builtin")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--mlp", default="0.25,0.5,1")
    parser.add_argument("--context", type=int, default=None,
                        help="prompt positions (default: 80 demo, 700 proxy-llava)")
    parser.add_argument("--visual", type=int, default=None,
                        help="visual positions among them (default: 36 demo, 576 proxy-llava)")
    parser.add_argument("--draft-vocab", default=None,
                        help="draft vocabulary shares, e.g. 0.25,1 (default: the default space's, "
                             "0.25 and 1 for a vocabulary of 16,000 tokens or more, else 1)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", choices=["off", "on"], default="off",
                        help="time the compiled static-shape step (inductor) instead of eager")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dreams_nas.latency.measure.steps import draft_forward
    from dreams_nas.supernet.core.space import DEFAULT_DRAFT_VOCAB, LARGE_VOCAB
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules
    from dreams_nas.supernet.target.adapter import PrefillOutput
    from dreams_nas.supernet.target.static import capacity_for, compile_backend

    hidden, heads, head_dim, inner, vocab, layers = GEOMETRIES[args.geometry]
    proxy = args.geometry != "builtin"
    context = args.context or (700 if proxy else 80)
    visual = args.visual if args.visual is not None else (576 if proxy else 36)
    if not 0 <= visual < context:
        parser.error(f"--visual {visual} must be below --context {context}")
    dtype = getattr(torch, args.dtype)
    mlp = tuple(float(x) for x in args.mlp.split(","))
    shares = (tuple(float(x) for x in args.draft_vocab.split(",")) if args.draft_vocab
              else DEFAULT_DRAFT_VOCAB if vocab >= LARGE_VOCAB else (1.0,))
    inject = layers // 2
    config = DraftConfig(hidden_size=hidden, num_heads=heads, head_dim=head_dim,
                         intermediate_size=inner, vocab_size=vocab, inject_layers=(inject,),
                         num_target_layers=layers, num_layers=args.depth, mlp_shares=mlp,
                         vocab_shares=shares)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        embed = torch.nn.Embedding(vocab, hidden).to(dtype)
        head = torch.nn.Linear(hidden, vocab, bias=False).to(dtype)
    shared = SharedTargetModules(embed, head)
    supernet = DreamDraft.initialised(config, shared, args.seed).to(dtype).eval()
    if config.has_vocab_order:  # which tokens a draft vocabulary keeps: any order costs the same
        supernet.set_vocab_order(torch.randperm(vocab, generator=gen))
    start = 2  # the image follows a two-token preamble
    prefill = PrefillOutput(
        input_ids=torch.randint(0, vocab, (1, context), generator=gen),
        logits=torch.zeros(1, vocab),
        last_hidden=torch.randn(1, context, hidden, generator=gen).to(dtype),
        layer_hidden={inject: torch.randn(1, context, hidden, generator=gen).to(dtype)},
        visual_positions=torch.arange(start, start + visual),
        visual_scores=torch.rand(visual, generator=gen))
    quarters = sorted({max(1, round(heads * q / 4)) for q in (1, 2, 3, 4)})
    specs = [SubnetSpec(h, v, inject, 1, depth=d, mlp=m, draft_vocab=n)
             for h, v, d, m, n in itertools.product(quarters, (0.25, 1.0), range(1, args.depth + 1),
                                                     mlp, shares)]

    # what the drafter's `start` reads of a target: its step mode and static cache's capacity
    steps_of = None if args.compile == "off" else SimpleNamespace(
        step_mode="compiled", static=SimpleNamespace(capacity=capacity_for(context + 16),
                                                     backend=compile_backend()))

    def time_step(spec: SubnetSpec) -> float:
        """The median step of `spec`, extracted and started afresh (one subnet in memory at a
        time: a proxy-sized supernet's deepest subnet holds ~0.5 GB in float32)."""
        drafter = DreamDrafter(extract(supernet, spec), spec)
        drafter.draft.attach(shared)
        drafter.start(steps_of, prefill)  # type: ignore[arg-type]
        cache = drafter._cache
        # the step the profile's `draft` kind times (`latency.measure.steps.draft_forward`)
        step = draft_forward(drafter.steps, drafter.draft,
                             (torch.tensor([[1]]), prefill.last_hidden[:, -1:],
                              torch.tensor([[context]])), drafter._memory, cache,
                             drafter._committed)

        for _ in range(10):
            step()
        times = []
        for _ in range(args.repeats):
            begin = time.perf_counter_ns()
            step()
            times.append((time.perf_counter_ns() - begin) / 1e6)
        return statistics.median(times)

    samples: dict[str, list[float]] = {spec.id: [] for spec in specs}
    order = list(specs)
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        rng.shuffle(order)
        for i, spec in enumerate(order):
            samples[spec.id].append(time_step(spec))
            print(f"\rround {r + 1}/{args.rounds}: {i + 1}/{len(order)} subnets",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ms = {sid: statistics.median(v) for sid, v in samples.items()}
    fastest, slowest = min(ms, key=ms.get), max(ms, key=ms.get)  # type: ignore[arg-type]
    print(f"{args.geometry}: hidden {hidden}, {heads} heads of {head_dim}, MLP {inner}, vocab "
          f"{vocab}; context {context} ({visual} visual); {args.dtype}, {args.threads} thread(s), "
          f"{'compiled' if steps_of else 'eager'} steps; "
          f"{len(specs)} subnets, median of {args.rounds} rounds x {args.repeats} steps")
    for d in range(1, args.depth + 1):
        at = {s.id: ms[s.id] for s in specs if s.depth == d}
        lo, hi = min(at, key=at.get), max(at, key=at.get)  # type: ignore[arg-type]
        print(f"  depth {d}: fastest {at[lo]:.3f} ms ({lo}), slowest {at[hi]:.3f} ms ({hi})")
    ratio = ms[slowest] / ms[fastest]
    print(f"range: slowest {ms[slowest]:.3f} ms ({slowest}) / fastest {ms[fastest]:.3f} ms "
          f"({fastest}) = {ratio:.2f}x")
    print(json.dumps({"geometry": args.geometry, "dtype": args.dtype, "threads": args.threads,
                      "compile": args.compile,
                      "context": context, "visual": visual, "range": round(ratio, 3),
                      "fastest": [fastest, round(ms[fastest], 4)],
                      "slowest": [slowest, round(ms[slowest], 4)],
                      "ms": {k: round(v, 4) for k, v in ms.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
