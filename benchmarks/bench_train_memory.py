"""Peak host memory of supernet training against the number of training prompts.

    python benchmarks/bench_train_memory.py [--prompts 16 64 256] [--steps 2] [--batch 4]
        [--threads 2]

Each count runs in a process of its own (its peak RSS, `ru_maxrss`, is its own) and does what
`dreams-nas train` does after the target's answers: the target's features of every prompt go
to a feature store on disk (`supernet.training.feature_store.build_store`, shards of 8 prompts, each
written and dropped), then `train_supernet` trains a DREAM-S draft of the proxy target's shape
(`proxy-llava`: hidden 1024, 16 heads, a 32,000-token LM head, the draft's own sequence holding
the 576 visual tokens) for `--steps` steps reading the store, autocast to bfloat16 as on the
proxy. The features come from a stand-in for the target (random tensors of the proxy's shapes:
a 602-token prompt with 576 visual positions, a 16-token answer, 4 inject layers, one
distillation layer, bfloat16): computing them with the proxy itself takes ~35 s a prompt in
bfloat16 on a CPU without native bfloat16, hours at 256 prompts, and memory does not depend on
the values. `--in-memory` trains from the same samples held in a list instead (what training
did before the store), for contrast. One JSON line per count: peak RSS after the store and after
training, the store's size, seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HIDDEN, HEADS, INNER, VOCAB, LAYERS = 1024, 16, 2816, 32_000, 20
PROMPT, VISUAL, ANSWER = 602, 576, 16
INJECT = (5, 10, 15, 20)
DISTILL = (10,)


class StandInTarget:
    """What `features.target_record` reads of a target, with random tensors of the proxy's
    shapes (bfloat16, as the proxy computes them)."""

    device = torch.device("cpu")
    dtype = torch.bfloat16

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def _hidden(self, n: int) -> torch.Tensor:
        return torch.randn(1, n, HIDDEN, generator=self.generator).to(self.dtype)

    def prefill(self, inputs: dict, layers: tuple[int, ...] = ()) -> object:
        from dreams_nas.supernet.target.adapter import PrefillOutput

        return PrefillOutput(
            input_ids=inputs["input_ids"], logits=torch.zeros(1, 1),
            last_hidden=self._hidden(PROMPT), layer_hidden={i: self._hidden(PROMPT)
                                                            for i in layers},
            visual_positions=torch.arange(5, 5 + VISUAL),
            visual_scores=torch.rand(VISUAL, generator=self.generator))

    def verify(self, ids: torch.Tensor, layers: tuple[int, ...] = ()) -> object:
        from dreams_nas.supernet.target.adapter import VerifyOutput

        n = int(ids.shape[1])
        return VerifyOutput(logits=torch.zeros(1, n, 1), last_hidden=self._hidden(n),
                            layer_hidden={i: self._hidden(n) for i in layers})


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # KiB on Linux


def one(n: int, steps: int, batch: int, in_memory: bool, folder: Path) -> dict:
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.feature_store import StoreLayout, build_store
    from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

    start = time.perf_counter()
    target = StandInTarget(0)
    gen = torch.Generator().manual_seed(1)
    prompts = [{"input_ids": torch.randint(0, VOCAB, (1, PROMPT), generator=gen)}
               for _ in range(n)]
    answers = [torch.randint(0, VOCAB, (ANSWER,), generator=gen) for _ in range(n)]
    store = build_store(folder / "features", target, prompts, answers,  # type: ignore[arg-type]
                        StoreLayout(f"bench-{n}", INJECT, DISTILL), show_progress=False)
    samples = list(store) if in_memory else store
    after_store = peak_rss_gb()
    built = time.perf_counter() - start
    embed = torch.nn.Embedding(VOCAB, HIDDEN).to(torch.bfloat16).requires_grad_(False)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16).requires_grad_(False)
    config = DraftConfig(hidden_size=HIDDEN, num_heads=HEADS, head_dim=HIDDEN // HEADS,
                         intermediate_size=INNER, vocab_size=VOCAB, inject_layers=INJECT,
                         num_target_layers=LAYERS)
    draft = DreamDraft.initialised(config, SharedTargetModules(embed, head), 0)
    train_supernet(draft, TrainingSet(samples, DISTILL),
                   TrainConfig(warmup_steps=steps, multires_steps=0, batch_size=batch,
                               unroll=0, checkpoint_every=10_000),
                   show_progress=False, compute_dtype=torch.bfloat16)
    return {"prompts": n, "mode": "in-memory" if in_memory else "store",
            "store_mb": round(store.num_bytes / 1e6, 1),
            "peak_rss_gb_after_store": round(after_store, 3),
            "peak_rss_gb": round(peak_rss_gb(), 3),
            "store_s": round(built, 1), "total_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--in-memory", action="store_true")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        torch.set_num_threads(args.threads)
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(one(args.one, args.steps, args.batch, args.in_memory, Path(tmp))),
                  flush=True)
        return 0
    for n in args.prompts:
        cmd = [sys.executable, __file__, "--one", str(n), "--steps", str(args.steps),
               "--batch", str(args.batch), "--threads", str(args.threads)]
        if args.in_memory:
            cmd.append("--in-memory")
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
