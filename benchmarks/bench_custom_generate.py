"""The searched draft through transformers' own `generate` (`custom_generate=<spec folder>`)
against `dreams-nas generate`'s path with the same spec, plain `model.generate()` and HF assisted
generation, side by side in one run.

    python benchmarks/bench_custom_generate.py --spec <dir> [--target builtin] [--prompts 32]
        [--repeats 5] [--max-new-tokens 64] [--threads 1] [--assistant builtin|none|DIR] [--json]

`<dir>`: a spec folder (`<run>/specs/<id>`) or a `dreams-nas export` of one. Per prompt, within
each repeat (who goes first rotating): `model.generate(do_sample=False)`, `model.generate(...,
custom_generate=<dir>, trust_remote_code=True)`, the spec decoding as `dreams-nas generate
--drafter <dir>` does (`supernet.decoding.loop.generate`), and `generate(assistant_model=...)`.
Tokens/s over the whole calls, median over repeats; every output is checked against HF greedy.
Goal: `custom_generate` within 5 % of `dreams-nas generate`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def methods(target: Any, spec: str, max_new: int, assistant: Any) -> dict[str, Callable]:
    import torch
    from dreams_nas.supernet.decoding.loop import generate
    from dreams_nas.supernet.decoding.registry import load_drafter

    model = target.model
    drafter = load_drafter(spec, target)

    def hf(**extra: Any) -> Callable[[dict], list[int]]:
        def run(inputs: dict) -> list[int]:
            with torch.inference_mode():
                out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new, **extra)
            return out[0, inputs["input_ids"].shape[1]:].tolist()
        return run

    def ours(inputs: dict) -> list[int]:
        out = generate(target, inputs, drafter, shape=drafter.spec.shape, max_new_tokens=max_new)
        return out.tokens.tolist()

    runs = {"HF generate": hf(), "custom_generate=<spec>": hf(custom_generate=spec,
                                                                trust_remote_code=True),
            "dreams-nas generate path": ours}
    if assistant is not None:
        runs["HF assisted generation"] = hf(assistant_model=assistant)
    return runs


def measure(runs: dict[str, Callable], prompts: list[dict], repeats: int) -> list[dict]:
    names = list(runs)
    expected = [runs[names[0]](p) for p in prompts]
    for name in names[1:]:
        runs[name](prompts[0])  # warm-up
    seconds = {n: [0.0] * repeats for n in names}
    tokens = dict.fromkeys(names, 0)
    same = dict.fromkeys(names, True)
    for r in range(repeats):
        for i, p in enumerate(prompts):
            for n in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                out = runs[n](p)
                seconds[n][r] += time.perf_counter() - start
                same[n] &= out == expected[i]
                if r == 0:
                    tokens[n] += len(out)
    base = statistics.median(tokens[names[0]] / s for s in seconds[names[0]])
    rows = []
    for n in names:
        tps = [tokens[n] / s for s in seconds[n]]
        rows.append({"method": n, "tokens_per_s": statistics.median(tps),
                     "range": [min(tps), max(tps)], "vs_hf": statistics.median(tps) / base,
                     "identical": same[n]})
    path = next(r for r in rows if r["method"] == "dreams-nas generate path")
    for r in rows:
        r["vs_dreams_nas_generate"] = r["tokens_per_s"] / path["tokens_per_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--target", default="builtin")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--assistant", default="builtin")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from peers import load_assistant

    with torch_threads(args.threads):
        target = TargetAdapter.load(resolve_target(args.target), target_id=args.target)
        examples = load_eval_examples("builtin", args.prompts, 0)
        prompts = [target.build_inputs(e.image_path, e.prompt) for e in examples]
        helper = load_assistant(args.assistant, target)
        rows = measure(methods(target, str(Path(args.spec).resolve()), args.max_new_tokens,
                               helper), prompts, args.repeats)
    if args.json:
        print(json.dumps({"rows": rows, "threads": args.threads, "prompts": len(prompts)}))
    else:
        print("| method | tokens/s (range) | vs HF generate | vs dreams-nas generate | identical |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['method']} | {r['tokens_per_s']:.1f} ({r['range'][0]:.1f}-"
                  f"{r['range'][1]:.1f}) | {r['vs_hf']:.2f}x | {r['vs_dreams_nas_generate']:.3f}x "
                  f"| {'yes' if r['identical'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
