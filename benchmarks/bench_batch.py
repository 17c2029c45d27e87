"""Batched decoding at several batch sizes: a searched pick against plain batched decoding and
HF `generate` on the same padded batch, side by side in one run.

    python benchmarks/bench_batch.py --run <run> --hardware <id> [--batch-sizes 1 2 4 8]
    python benchmarks/bench_batch.py --spec <run>/specs/<id> [--spec ...] [--batch-sizes 1 2 4 8]
        [--prompts 32] [--repeats 5] [--max-new-tokens 64] [--threads 1] [--compile off]
        [--json] [--out FILE]

At each batch size B the prompts are decoded B at a time, in order, by
  1. HF `model.generate(do_sample=False)` on the padded batch (left padding, the processor's
     own collation): its batched greedy decoding;
  2. our plain batched decoding (`supernet.decoding.batch_loop.generate_batch`, no drafter);
  3. each pick: the same rows with a spec folder's draft (`BatchDreamDrafter`); several
     `--spec`s (e.g. the picks of two batch sizes) measure what each loses at the other's.
     `--run R --hardware ID` takes the search's pick of every batch size given (best.json of
     ID at batch 1, of ID-b<B> past it), with its predicted speedup, and measures every pick
     at every batch size.
Within each repeat every chunk of B prompts runs all three, who goes first rotating.
Throughput is every new token over the calls' wall time (prefill included), median over
repeats; the decode phase is the tokens after each request's first over the time after the
prefills (ours: the loop's timed phases; HF: its call less a `max_new_tokens=1` call of the same
batch in the same repeat). Every row is checked against HF greedy decoding of that request
alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HF = "HF generate, padded batch"
PLAIN = "ours, plain batched"


def _cut(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def hf_batch(target: Any, examples: list[Any]) -> dict[str, Any]:
    """The processor's padded batch of `examples` (left padding, as HF generates)."""
    from dreams_nas.supernet.target.images import open_image

    texts = [target.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": e.prompt}]}],
        add_generation_prompt=True, tokenize=False) for e in examples]
    target.tokenizer.padding_side = "left"
    batch = target.processor(images=[open_image(e.image_path) for e in examples], text=texts,
                             return_tensors="pt", padding=True)
    return target._to_device(dict(batch))


def methods(target: Any, max_new: int, spec_dirs: list[str]) -> dict[str, Callable]:
    """name -> ((examples, inputs) -> (rows' tokens, whole seconds, decode seconds))."""
    import torch
    from dreams_nas.supernet.decoding.batch_dream import BatchDreamDrafter
    from dreams_nas.supernet.decoding.batch_loop import generate_batch
    from dreams_nas.supernet.decoding.registry import load_drafter

    model, eos = target.model, target.eos_token_ids

    def hf(examples: list[Any], inputs: list[dict]) -> tuple[list[list[int]], float, float]:
        batch = hf_batch(target, examples)
        pad = target.tokenizer.pad_token_id
        times = []
        for n in (1, max_new):
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(**batch, do_sample=False, max_new_tokens=n,
                                     pad_token_id=pad)
            times.append(time.perf_counter() - start)
        rows = [_cut(row, eos) for row in out[:, batch["input_ids"].shape[1]:].tolist()]
        return rows, times[1], times[1] - times[0]

    def ours(spec_dir: str | None) -> Callable:
        one = None if spec_dir is None else load_drafter(spec_dir, target)
        draft = None if one is None else BatchDreamDrafter(one.draft, one.spec)
        shape = 1 if one is None else one.spec.shape

        def run(examples: list[Any], inputs: list[dict]) -> tuple[list[list[int]], float, float]:
            start = time.perf_counter()
            out = generate_batch(target, inputs, draft, shape=shape,
                                 max_new_tokens=max_new, timed=True)
            return ([t.tolist() for t in out.tokens], time.perf_counter() - start,
                    out.stats.decode_s)
        return run

    return {HF: hf, PLAIN: ours(None),
            **{f"the pick {Path(d).name}, batched": ours(d) for d in spec_dirs}}


def measure(target: Any, runs: dict[str, Callable], examples: list[Any], inputs: list[dict],
            sizes: list[int], repeats: int, max_new: int) -> list[dict[str, Any]]:
    from dreams_nas.supernet.decoding.loop import plain_generate

    expected = [plain_generate(target, i, max_new_tokens=max_new).tokens.tolist()
                for i in inputs]
    names = list(runs)
    rows = []
    for size in sizes:
        chunks = [(examples[i:i + size], inputs[i:i + size])
                  for i in range(0, len(inputs), size)]
        for name in names:  # untimed warm-up: every shape compiles here
            for chunk in chunks:
                runs[name](*chunk)
        whole = {n: [0.0] * repeats for n in names}
        decode = {n: [0.0] * repeats for n in names}
        same = dict.fromkeys(names, True)
        tokens = dict.fromkeys(names, 0)
        for r in range(repeats):
            for c, chunk in enumerate(chunks):
                at = (r + c) % len(names)
                for n in names[at:] + names[:at]:
                    out, total, dec = runs[n](*chunk)
                    whole[n][r] += total
                    decode[n][r] += dec
                    same[n] &= out == expected[c * size:c * size + len(out)]
                    if r == 0:
                        tokens[n] += sum(len(o) for o in out)
        for n in names:
            tps = [tokens[n] / s for s in whole[n]]
            dps = [(tokens[n] - len(inputs)) / s for s in decode[n]]
            rows.append({"batch": size, "method": n, "tokens_per_s": statistics.median(tps),
                         "range": [min(tps), max(tps)],
                         "decode_tokens_per_s": statistics.median(dps),
                         "decode_range": [min(dps), max(dps)], "identical": same[n],
                         "new_tokens": tokens[n],
                         "per_repeat_decode": dps})
        plain = next(x for x in rows if x["batch"] == size and x["method"] == PLAIN)
        for x in rows:
            if x["batch"] == size:
                x["vs_plain"] = x["tokens_per_s"] / plain["tokens_per_s"]
                x["decode_vs_plain"] = statistics.median(
                    a / b for a, b in zip(x["per_repeat_decode"], plain["per_repeat_decode"],
                                          strict=True))
    return rows


def run_picks(run_dir: str, hardware: str, sizes: list[int]) -> tuple[list[str], dict]:
    """The search's pick at each batch size (`search --batch-size`): its spec folders (each
    once) and, per batch size, its spec id and predicted and measured speedups."""
    from dreams_nas.supernet.core.runfolder import RunFolder

    run = RunFolder(run_dir)
    folders: list[str] = []
    picks: dict[int, dict[str, Any]] = {}
    for size in sizes:
        hw = hardware if size == 1 else f"{hardware}-b{size}"
        best = json.loads(run.best_json(hw).read_text())
        folder = str(run.root / best["spec_dir"])
        if folder not in folders:
            folders.append(folder)
        picks[size] = {"hardware_id": hw, "spec_id": best["spec_id"],
                       "predicted": best["predicted"]["speedup"],
                       "measured": (best.get("measured") or {}).get("speedup")}
    return folders, picks


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| B | method | tokens/s (range) | vs plain | decode tokens/s (range) | vs plain "
             "| identical |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['method']} | {r['tokens_per_s']:.1f} "
            f"({r['range'][0]:.1f}-{r['range'][1]:.1f}) | {r['vs_plain']:.2f}x | "
            f"{r['decode_tokens_per_s']:.1f} ({r['decode_range'][0]:.1f}-"
            f"{r['decode_range'][1]:.1f}) | {r['decode_vs_plain']:.2f}x | "
            f"{'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines)


def bench(spec_dirs: list[str], *, target_name: str = "builtin", sizes: list[int], prompts: int,
          repeats: int, max_new_tokens: int, threads: int | None, compile: str) -> dict:
    import torch
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.target.adapter import TargetAdapter

    with torch_threads(threads):
        target = TargetAdapter.load(resolve_target(target_name), target_id=target_name)
        target.use_steps("compiled" if compile == "on" else "static")
        examples = load_eval_examples("builtin", prompts, 0)
        inputs = [target.build_inputs(e.image_path, e.prompt) for e in examples]
        rows = measure(target, methods(target, max_new_tokens, spec_dirs), examples, inputs,
                       sizes, repeats, max_new_tokens)
        n_threads = torch.get_num_threads()
    return {"target": target.describe(), "specs": [Path(d).name for d in spec_dirs],
            "prompts": len(inputs),
            "repeats": repeats, "max_new_tokens": max_new_tokens, "threads": n_threads,
            "compile": compile, "torch": torch.__version__,
            "python": platform.python_version(), "rows": rows, "table": table(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", default=[], metavar="SPEC_DIR",
                        help="a pick's spec folder (repeat for several)")
    parser.add_argument("--run", default=None, help="with --hardware: every batch size's pick")
    parser.add_argument("--hardware", default=None,
                        help="the batch-1 hardware id whose -b<B> searches hold the picks")
    parser.add_argument("--target", default="builtin")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile", choices=("off", "on"), default="off")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    picks = None
    if args.run:
        folders, picks = run_picks(args.run, args.hardware, args.batch_sizes)
        args.spec = [*args.spec, *(f for f in folders if f not in args.spec)]
    if not args.spec:
        parser.error("give --spec SPEC_DIR or --run RUN --hardware ID")
    result = bench(args.spec, target_name=args.target, sizes=args.batch_sizes,
                   prompts=args.prompts, repeats=args.repeats,
                   max_new_tokens=args.max_new_tokens, threads=args.threads,
                   compile=args.compile)
    if picks is not None:
        result["picks"] = picks
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "table"}) if args.json
          else result["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
