"""Compiled steps are lossless on every family: inductor's compiled decode, verify and
tree-verify steps decode what HF greedy `generate` decodes, token for token.

    python benchmarks/bench_compiled_families.py [--prompts 4] [--max-new-tokens 12] [--json]

For each of the eight families' tiny configs (`tests/_support/models.py`, float32) and each
prompt: HF `generate(do_sample=False)` is the reference; then our plain decoding, the oracle
drafter's chains of 1 and 3, prompt lookup's chain of 3 and (where the family verifies trees)
the oracle's 2x2 token tree run three ways: dynamic cache eager, static cache eager and static
cache compiled (inductor on the CPU). Prints one row per family and way: the runs that equal
the reference, and the compile seconds per shape. The suite checks the static path on every
family and one compiled shape (`tests/supernet/test_static_target.py`); compiling every shape
of every family with inductor is this script's work (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

MODES = ("dynamic", "static", "compiled")


def runs(adapter: Any, inputs: dict, max_new_tokens: int) -> dict[str, list[int]]:
    """Every decoding of one prompt this script compares, by name."""
    from dreams_nas.supernet.core.tree import TokenTree
    from dreams_nas.supernet.decoding.drafters import OracleDrafter, PromptLookupDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate

    n = max_new_tokens
    out = {"plain": plain_generate(adapter, inputs, max_new_tokens=n)}
    for g in (1, 3):
        out[f"chain{g}"] = generate(adapter, inputs, OracleDrafter(horizon=n), shape=g,
                                    max_new_tokens=n)
    out["lookup3"] = generate(adapter, inputs, PromptLookupDrafter(), shape=3, max_new_tokens=n)
    if adapter.supports_trees:
        out["tree2x2"] = generate(adapter, inputs, OracleDrafter(horizon=n),
                                  shape=TokenTree((2, 2)), max_new_tokens=n)
    return {name: r.tokens.tolist() for name, r in out.items()}


def check_family(family: str, prompts: int, max_new_tokens: int) -> list[dict[str, Any]]:
    import torch
    from _support.models import PROMPTS, build_tiny_vlm, tiny_image
    from dreams_nas.supernet.target.adapter import TargetAdapter

    model, processor = build_tiny_vlm(family)
    sizes = ((16, 16), (32, 16), (16, 32))
    rows = []
    for mode in MODES:
        adapter = TargetAdapter.from_model(model, processor)
        adapter.use_steps(mode)
        total = same = 0
        start = time.perf_counter()
        for i in range(prompts):
            inputs = adapter.build_inputs(tiny_image(i, sizes[i % 3]), PROMPTS[i])
            with torch.inference_mode():
                ref = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
            ref = ref[0, inputs["input_ids"].shape[1]:].tolist()
            for tokens in runs(adapter, inputs, max_new_tokens).values():
                total += 1
                same += tokens == ref
        warm = dict(adapter.static.warmup_s) if adapter.static is not None else {}
        rows.append({"family": family, "mode": mode, "runs": total, "identical": same,
                     "trees": adapter.supports_trees, "seconds": time.perf_counter() - start,
                     "compile_s": {k: round(v, 1) for k, v in warm.items()}})
        adapter.use_steps("dynamic")
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch
    from _support.models import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [row for family in args.families
            for row in check_family(family, args.prompts, args.max_new_tokens)]
    if args.json:
        print(json.dumps({"rows": rows, "torch": torch.__version__}))
    else:
        print("| family | mode | identical to HF greedy | trees | compile s per shape |")
        print("|---|---|---|---|---|")
        for r in rows:
            shapes = ", ".join(f"{k} {v}" for k, v in r["compile_s"].items()) or "-"
            print(f"| {r['family']} | {r['mode']} | {r['identical']}/{r['runs']} | "
                  f"{'yes' if r['trees'] else 'chains only'} | {shapes} |")
    return 0 if all(r["identical"] == r["runs"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
