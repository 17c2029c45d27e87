"""Plain decoding with compiled static-shape steps against eager, and against HF `generate`
eager and with its own static-cache-and-compile recipe, side by side in one run.

    python benchmarks/bench_compile.py [--target builtin] [--prompts 32] [--repeats 5]
        [--max-new-tokens 64] [--threads 1] [--spec <run>/specs/<id>] [--json] [--out FILE]

Methods, all on one target and the built-in evaluation prompts, interleaved per prompt within
each repeat (who goes first rotates):
  1. HF `model.generate(do_sample=False)`: dynamic cache, eager (the 1.0x reference);
  2. HF `generate(cache_implementation="static", compile_config=...)`: HF's own recipe, which
     compiles the decode step over a `StaticCache` (on the CPU only when the compile config
     sets `_compile_all_devices`, as this script does);
  3. our plain decoding (`supernet.decoding.plain_generate`), dynamic cache, eager
     (`--compile off`);
  4. the same over a static cache with each step compiled (`--compile on`);
  5. with `--spec`, a searched pick's spec folder decoding as `dreams-nas generate --drafter`
     does, eager and compiled (the draft's steps compiled with the target's).
Every output is checked against HF greedy token for token. Whole calls: new tokens over the
calls' wall time (prefill included), median over repeats. Decode phase: the tokens after the
first over the time after the prefill: our loop times its phases (`timed=True`); an HF call's
prefill is taken as the same prompt's `max_new_tokens=1` call in the same repeat. Compilation
happens in an untimed warm-up pass over every prompt; its seconds per shape are reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REFERENCE = "HF generate, eager"


def _hf(model: Any, inputs: dict, max_new_tokens: int, **kwargs: Any) -> tuple[list[int], float]:
    import torch

    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)
    return out[0, inputs["input_ids"].shape[1]:].tolist(), time.perf_counter() - start


def methods(target: Any, compiled: Any, max_new_tokens: int, spec_dir: str | None = None
            ) -> dict[str, Callable[[dict], tuple[list[int], float, float]]]:
    """name -> (inputs -> (tokens, whole-call seconds, decode-phase seconds)); with `spec_dir`
    (a searched pick's spec folder) the pick too, eager and compiled (a draft each)."""
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.decoding.registry import load_drafter
    from peers import hf_compile_config

    model = target.model

    def hf(**kwargs: Any) -> Callable[[dict], tuple[list[int], float, float]]:
        def run(inputs: dict) -> tuple[list[int], float, float]:
            _, prefill = _hf(model, inputs, 1, **kwargs)
            tokens, total = _hf(model, inputs, max_new_tokens, **kwargs)
            return tokens, total, total - prefill
        return run

    def ours(adapter: Any, drafter: Any = None) -> Callable[[dict], tuple[list[int], float,
                                                                          float]]:
        def run(inputs: dict) -> tuple[list[int], float, float]:
            start = time.perf_counter()
            if drafter is None:
                out = plain_generate(adapter, inputs, max_new_tokens=max_new_tokens, timed=True)
            else:
                out = generate(adapter, inputs, drafter, max_new_tokens=max_new_tokens,
                               shape=drafter.default_tree or drafter.default_draft_len,
                               timed=True)
            return out.tokens.tolist(), time.perf_counter() - start, out.stats.decode_s
        return run

    runs = {REFERENCE: hf(), "HF generate, static cache + compile":
            hf(cache_implementation="static", compile_config=hf_compile_config(target.device)),
            "ours, dynamic cache, eager (--compile off)": ours(target),
            "ours, static cache, compiled (--compile on)": ours(compiled)}
    if spec_dir is not None:
        pick = Path(spec_dir).name
        runs[f"the pick {pick}, eager"] = ours(target, load_drafter(spec_dir, target))
        runs[f"the pick {pick}, compiled"] = ours(compiled, load_drafter(spec_dir, compiled))
    return runs


def measure(runs: dict[str, Callable], prompts: list[dict], repeats: int) -> list[dict[str, Any]]:
    names = list(runs)
    expected = [runs[REFERENCE](p)[0] for p in prompts]  # also the reference's warm-up
    warm: dict[str, float] = {}
    for name in names[1:]:  # untimed: every shape of every prompt compiles here
        start = time.perf_counter()
        for p in prompts:
            runs[name](p)
        warm[name] = time.perf_counter() - start
    whole = {n: [] for n in names}
    decode = {n: [] for n in names}
    same = dict.fromkeys(names, True)
    tokens = dict.fromkeys(names, 0)
    for r in range(repeats):
        for n in names:
            whole[n].append(0.0)
            decode[n].append(0.0)
        for i, p in enumerate(prompts):
            for n in names[r % len(names):] + names[:r % len(names)]:
                out, total, dec = runs[n](p)
                whole[n][-1] += total
                decode[n][-1] += dec
                same[n] &= out == expected[i]
                if r == 0:
                    tokens[n] += len(out)
    n_prompts = len(prompts)
    ref_tps = statistics.median(tokens[REFERENCE] / s for s in whole[REFERENCE])
    ref_dec = statistics.median((tokens[REFERENCE] - n_prompts) / s for s in decode[REFERENCE])
    rows = []
    for n in names:
        tps = [tokens[n] / s for s in whole[n]]
        dps = [(tokens[n] - n_prompts) / s for s in decode[n]]
        rows.append({"method": n, "tokens_per_s": statistics.median(tps),
                     "range": [min(tps), max(tps)],
                     "ratio": statistics.median(tps) / ref_tps,
                     "decode_tokens_per_s": statistics.median(dps),
                     "decode_range": [min(dps), max(dps)],
                     "decode_ratio": statistics.median(dps) / ref_dec,
                     "identical": same[n], "new_tokens": tokens[n],
                     "warmup_s": warm.get(n, 0.0)})
    return rows


def bench(target_name: str = "builtin", *, prompts: int = 32, repeats: int = 5,
          max_new_tokens: int = 64, threads: int | None = 1,
          spec_dir: str | None = None) -> dict[str, Any]:
    import torch
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.target.adapter import TargetAdapter

    with torch_threads(threads):
        target = TargetAdapter.load(resolve_target(target_name), target_id=target_name)
        compiled = TargetAdapter.from_model(target.model, target.processor, target.tokenizer)
        compiled.use_steps("compiled")
        examples = load_eval_examples("builtin", prompts, 0)
        inputs = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        rows = measure(methods(target, compiled, max_new_tokens, spec_dir), inputs, repeats)
        n_threads = torch.get_num_threads()
    compile_s = dict(compiled.static.warmup_s) if compiled.static is not None else {}
    return {"target": target.describe(), "prompts": len(inputs), "repeats": repeats,
            "max_new_tokens": max_new_tokens, "threads": n_threads, "torch": torch.__version__,
            "python": platform.python_version(), "compile_s_per_shape": compile_s,
            "rows": rows, "table": table(rows)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | tokens/s (range) | vs HF eager | decode tokens/s (range) | vs HF eager "
             "| identical | warm-up s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['tokens_per_s']:.1f} ({r['range'][0]:.1f}-{r['range'][1]:.1f})"
            f" | {r['ratio']:.2f}x | {r['decode_tokens_per_s']:.1f} "
            f"({r['decode_range'][0]:.1f}-{r['decode_range'][1]:.1f}) | {r['decode_ratio']:.2f}x"
            f" | {'yes' if r['identical'] else 'NO'} | {r['warmup_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--spec", default=None, metavar="SPEC_DIR",
                        help="a searched pick's spec folder (<run>/specs/<id>): decode with it "
                             "too, eager and compiled")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = bench(args.target, prompts=args.prompts, repeats=args.repeats,
                   max_new_tokens=args.max_new_tokens, threads=args.threads,
                   spec_dir=args.spec)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "table"}))
    else:
        print(result["table"])
        print(f"compile seconds per shape: {result['compile_s_per_shape']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
