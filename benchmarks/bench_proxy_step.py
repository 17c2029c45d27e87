"""One supernet training step of a draft of the proxy target's shape, in bfloat16 or float32.

    python benchmarks/bench_proxy_step.py [--dtype bfloat16|float32] [--unroll 6]
        [--batch 4] [--threads 2] [--profile]

The draft of `proxy-llava` (hidden 1024, 16 heads, a 32,000-token LM head, the 576 visual
tokens in its own sequence) trained for one phase-1 step on `--batch` prompts of the proxy's
shapes whose features come from `bench_train_memory`'s stand-in target (random tensors: the
cost does not depend on the values), autocast to `--dtype` as `train` does. One JSON line: the
step's seconds; `--profile` adds torch.profiler's top matrix products by shape on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train_memory as proxy  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.feature_store import StoreLayout, build_store
    from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--unroll", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    proxy.StandInTarget.dtype = dtype
    with tempfile.TemporaryDirectory() as tmp:
        gen = torch.Generator().manual_seed(1)
        prompts = [{"input_ids": torch.randint(0, proxy.VOCAB, (1, proxy.PROMPT), generator=gen)}
                   for _ in range(args.batch)]
        answers = [torch.randint(0, proxy.VOCAB, (proxy.ANSWER,), generator=gen)
                   for _ in range(args.batch)]
        store = build_store(Path(tmp) / "features", proxy.StandInTarget(0), prompts,  # type: ignore[arg-type]
                            answers, StoreLayout("step", proxy.INJECT, proxy.DISTILL),
                            show_progress=False)
        embed = torch.nn.Embedding(proxy.VOCAB, proxy.HIDDEN).to(dtype).requires_grad_(False)
        head = torch.nn.Linear(proxy.HIDDEN, proxy.VOCAB, bias=False).to(dtype)
        head.requires_grad_(False)
        config = DraftConfig(hidden_size=proxy.HIDDEN, num_heads=proxy.HEADS,
                             head_dim=proxy.HIDDEN // proxy.HEADS,
                             intermediate_size=proxy.INNER, vocab_size=proxy.VOCAB,
                             inject_layers=proxy.INJECT, num_target_layers=proxy.LAYERS)
        draft = DreamDraft.initialised(config, SharedTargetModules(embed, head), 0)
        train = TrainConfig(warmup_steps=1, multires_steps=0, batch_size=args.batch,
                            unroll=args.unroll, checkpoint_every=10_000)
        start = time.perf_counter()
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                train_supernet(draft, TrainingSet(store, proxy.DISTILL), train,
                               show_progress=False, compute_dtype=dtype)
            sys.stderr.write(prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=12) + "\n")
        else:
            train_supernet(draft, TrainingSet(store, proxy.DISTILL), train,
                           show_progress=False, compute_dtype=dtype)
        seconds = time.perf_counter() - start
    print(json.dumps({"dtype": args.dtype, "unroll": args.unroll, "batch": args.batch,
                      "threads": args.threads, "step_s": round(seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
