"""The 16-bit lossless check against injected faults: does it pass a clean run and catch a bug?

    python benchmarks/bench_lossless_faults.py [--target builtin] [--dtype bfloat16]
        [--prompts 32] [--max-new-tokens 64] [--draft-len 5] [--layer L] [--threads 1]
        [--json] [--out FILE.json]

The target decodes the built-in evaluation prompts plainly, then speculatively with the target
as its own oracle drafter (`OracleDrafter`: every proposal is plain decoding's own token, so
every cycle verifies `--draft-len` + 1 positions in one forward, the path whose numerics differ
from a one-token decode). Three conditions, each through `nas.stages.lossless.check_lossless`
(the search's verification check):

- ``clean``: the loop as it is; every divergence must be a near tie (the check passes);
- ``stray-kv``: once per prompt, at the first multi-token verify past the 2nd generated token,
  one layer's cached key and value of the first verified position are overwritten by the
  previous position's (one stray KV row in one layer);
- ``rope+1``: in every multi-token verify, one layer's rotary embedding is computed at each
  position + 1 (a RoPE position off by one in one layer).

Faults touch multi-token verifies only: plain decoding (one-token steps) stays the reference.
Reported per condition: prompts identical to plain decoding, prompts with near ties, prompts the
check refuses ("caught"), and the divergences' two-sided gaps in ulps of the dtype (each run's
own logit of its token minus the other's token), so the tolerance `NEAR_TIE_ULPS` can be read
against both the clean numerics and the faults. Logs on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CONDITIONS = ("clean", "stray-kv", "rope+1")


class FaultyTarget:
    """The target with one fault in its multi-token verifies (`fault`: a CONDITIONS name)."""

    def __init__(self, target: Any, fault: str, layer: int) -> None:
        self._target, self.fault, self.layer = target, fault, layer
        self._struck = True
        self._prompt_len = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def prefill(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = self._target.prefill(inputs, *args, **kwargs)
        self._struck, self._prompt_len = False, self._target.cache_len
        return out

    def verify(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        k, start = tokens.shape[1], self._target.cache_len
        if k == 1 or self.fault == "clean":
            return self._target.verify(tokens, *args, **kwargs)
        if self.fault == "rope+1":
            with self._rope_shifted():
                return self._target.verify(tokens, *args, **kwargs)
        out = self._target.verify(tokens, *args, **kwargs)
        if not self._struck and start >= self._prompt_len + 2:
            self._struck = True
            cached = self._target.cache.layers[self.layer]
            for tensor in (cached.keys, cached.values):  # (1, heads, positions, head_dim)
                tensor[:, :, start] = tensor[:, :, start - 1]
        return out

    @contextmanager
    def _rope_shifted(self) -> Any:
        decoder = self._target.decoder
        rotary = decoder.rotary_emb

        def shift(module: Any, args: Any, kwargs: dict) -> tuple[Any, dict]:
            hidden = args[0] if args else kwargs["hidden_states"]
            positions = kwargs["position_ids"] + 1
            return args, {**kwargs, "position_embeddings": rotary(hidden, position_ids=positions)}

        handle = decoder.layers[self.layer].register_forward_pre_hook(shift, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()


def _condition(target: Any, prompts: list[Any], fault: str, layer: int, draft_len: int,
               max_new_tokens: int) -> dict[str, Any]:
    from dreams_nas.nas.stages import lossless
    from dreams_nas.supernet.decoding.drafters import OracleDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate

    faulty = FaultyTarget(target, fault, layer)
    identical = ties = caught = 0
    gaps: list[float] = []
    drifts: list[float] = []
    refused: list[str] = []
    for index, prompt in enumerate(prompts):
        plain = plain_generate(target, dict(prompt), max_new_tokens=max_new_tokens)
        spec = generate(faulty, dict(prompt), OracleDrafter(), shape=draft_len,
                        max_new_tokens=max_new_tokens)
        tokens, plain_tokens = spec.tokens.tolist(), plain.tokens.tolist()
        identical += tokens == plain_tokens
        observed = lossless.observe_plain(target, prompt, max_new_tokens, expect=plain_tokens)
        checked = lossless.check_lossless(faulty, prompt, OracleDrafter, draft_len,
                                          max_new_tokens=max_new_tokens,
                                          outputs=(tokens, observed), where=(fault, index),
                                          ulps=math.inf)  # everything, to read its gaps
        found = checked.divergences
        worst = max([checked.drift_ulps] + [max(d.margin, d.spec_margin) / d.ulp for d in found])
        drifts.append(round(checked.drift_ulps, 2))
        gaps += [round(max(d.margin, d.spec_margin) / d.ulp, 2) for d in found]
        if worst > lossless.NEAR_TIE_ULPS[str(target.dtype).removeprefix("torch.")]:
            caught += 1
            refused.append(f"prompt {index}: {len(found)} divergence(s), worst {worst:.1f} ulps")
        else:
            ties += bool(found)
    return {"condition": fault, "prompts": len(prompts), "identical": identical,
            "near_ties": ties, "caught": caught, "gaps_ulps": sorted(gaps),
            "drift_ulps": sorted(drifts),
            "refused": refused}


def bench(target_name: str = "builtin", *, dtype: str = "bfloat16", prompts: int = 32,
          max_new_tokens: int = 64, draft_len: int = 5, layer: int | None = None,
          threads: int | None = 1) -> dict[str, Any]:
    import torch
    from dreams_nas.nas.stages.lossless import NEAR_TIE_ULPS
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import torch_dtype, torch_threads
    from dreams_nas.supernet.data.prompts import load_examples
    from dreams_nas.supernet.target.adapter import TargetAdapter

    with torch_threads(threads):
        target = TargetAdapter.load(resolve_target(target_name), target_id=target_name,
                                    device="cpu", dtype=torch_dtype(dtype))
        layer = target.num_layers // 2 if layer is None else layer
        examples = load_examples("builtin", "eval", prompts, prompts, 0, "--prompts")
        inputs = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        rows, n_threads = [], torch.get_num_threads()  # what the decoding ran at
        for fault in CONDITIONS:
            rows.append(_condition(target, inputs, fault, layer, draft_len, max_new_tokens))
            print(json.dumps({k: v for k, v in rows[-1].items()
                              if k not in ("gaps_ulps", "drift_ulps")}),
                  file=sys.stderr, flush=True)
    return {"target": target_name, "dtype": dtype, "prompts": prompts,
            "max_new_tokens": max_new_tokens, "draft_len": draft_len, "layer": layer,
            "near_tie_ulps": NEAR_TIE_ULPS[dtype], "threads": n_threads,
            "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
            "conditions": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="builtin")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16",
                                                                "float32"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draft-len", type=int, default=5)
    parser.add_argument("--layer", type=int, default=None, help="the faulty layer (default: "
                        "the middle one)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = bench(args.target, dtype=args.dtype, prompts=args.prompts,
                   max_new_tokens=args.max_new_tokens, draft_len=args.draft_len,
                   layer=args.layer, threads=args.threads)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    else:
        for row in result["conditions"]:
            print(f"{row['condition']:>9}: {row['identical']}/{row['prompts']} identical, "
                  f"{row['near_ties']} near ties, {row['caught']} caught; gaps (ulps) "
                  f"{row['gaps_ulps']}; drift (ulps) {row['drift_ulps']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
