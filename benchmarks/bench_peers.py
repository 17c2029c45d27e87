"""Side by side against what a user would pick instead, in one run on one machine.

    dreams-nas train && dreams-nas profile --device cpu && dreams-nas search   # the run folder
    python benchmarks/bench_peers.py --run dreams-run [--prompts 16] [--max-new-tokens 64]
        [--repeats 5] [--threads 1] [--assistant builtin|none|DIR] [--json] [--out FILE.json]
    python benchmarks/bench_peers.py --run dreams-run --hardware ID --batch-sizes 1 2 4 8

With `--batch-sizes` the peers are batched instead (`bench_batch.py`): at each batch size, HF
`generate` on the same padded batch, our plain batched decoding and every batch size's search
pick (`search --batch-size`), side by side.

Methods, all on the run's target and the same built-in evaluation prompts (the ones the search
scored), interleaved per prompt within each repeat:
  1. HF `model.generate(do_sample=False)`: the target alone, the 1.0x reference;
  2. HF prompt-lookup decoding (`prompt_lookup_num_tokens`); HF's own static-cache-and-compile
     recipe (`cache_implementation="static"`, `compile_config`), the target alone compiled;
  3. HF assisted generation (`assistant_model=`) with the built-in target's 2-layer "assistant"
     variant (same vision tower, processor and width, trained on the same synthetic data);
  4. our prompt-lookup drafter, 5. a fixed EAGLE-like DREAM draft (all heads, all visual tokens,
     last inject layer, draft_len 5), 6. the full supernet draft at its best predicted draft_len,
and
     7. the NAS-chosen subnet loaded from specs/<id>/ like `dreams-nas generate --drafter`; all
     four through `supernet.decoding.generate`, the code path of `dreams-nas generate`.
Tokens/s = new tokens over the wall time of the whole generate calls (prefill included), median
over repeats; tau = tokens per target forward after the prefill; every output is checked
against HF greedy token for token. Prints a markdown table (logs on stderr).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any


def bench(run_dir: str | Path, *, hardware: str | None = None, prompts: int = 16,
          max_new_tokens: int = 64, repeats: int = 5, assistant: str = "builtin",
          hf_lookup_tokens: int = 10, threads: int | None = None, show_progress: bool | None = None,
          hf_compile_backend: str = "inductor") -> dict[str, Any]:
    """The whole benchmark: returns the header facts, the rows and the markdown table."""
    import torch
    from dreams_nas.nas.stages.inputs import (
        RunModels,
        load_eval_examples,
        resolve_hardware,
    )
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.core.progress import progress
    from dreams_nas.supernet.core.runfolder import RunFolder
    from peers import (
        load_assistant,
        markdown_table,
        measure_methods,
        peer_methods,
        read_setup,
        vision_calls,
    )

    run = RunFolder(run_dir)
    hw = resolve_hardware(run, hardware)
    setup = read_setup(run, hw)
    models = RunModels(run, "cpu")
    with torch_threads(threads):
        target = models.target
        examples = load_eval_examples("builtin", prompts, 0)  # the eval prompts the search scored
        inputs = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        helper = load_assistant(assistant, target)
        seen = vision_calls(helper)  # does HF let the assistant see the image?
        methods = peer_methods(target, models.draft, setup, inputs, assistant=helper,
                               max_new_tokens=max_new_tokens, hf_lookup_tokens=hf_lookup_tokens,
                               hf_compile_backend=hf_compile_backend)
        bar = progress(total=repeats * len(inputs) * len(methods), desc="peer benchmark",
                       unit="call", disable=None if show_progress is None else not show_progress)
        try:
            rows = measure_methods(methods, len(inputs), repeats=repeats,
                                   on_step=lambda: bar.update(1))
        finally:
            bar.close()
        n_threads = torch.get_num_threads()
    header = {"run": str(run.root), "hardware_id": hw, "target": target.describe(),
              "prompts": len(inputs), "max_new_tokens": max_new_tokens, "repeats": repeats,
              "threads": n_threads, "torch": torch.__version__, "python": platform.python_version(),
              "nas_spec": setup.best_spec.id, "full_spec": setup.full_spec.id,
              "eagle_spec": setup.eagle_spec.id, "assistant": assistant,
              "assistant_vision_calls": seen[0] if helper is not None else None}
    return {**header, "rows": [r.to_dict() for r in rows], "table": markdown_table(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="dreams-run",
                        help="a run folder after train, profile and search")
    parser.add_argument("--hardware", default=None,
                        help="hardware id of the search (default: the only one)")
    parser.add_argument("--prompts", type=int, default=16,
                        help="built-in eval prompts (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5,
                        help="passes over the prompts (median; default 5)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's)")
    parser.add_argument("--assistant", default="builtin", metavar="builtin|none|DIR",
                        help="HF assisted generation's assistant (builtin: the demo "
                             "'assistant' variant)")
    parser.add_argument("--hf-lookup-tokens", type=int, default=10,
                        help="HF prompt_lookup_num_tokens (default 10, as in HF's docs)")
    parser.add_argument("--hf-compile-backend", default="inductor",
                        help="torch.compile backend of HF's static-cache peer (default "
                             "inductor; eager: dynamo's capture only, for tests)")
    parser.add_argument("--json", action="store_true",
                        help="also print the result as one JSON line")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="write the result there")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="batched peers at these batch sizes (bench_batch.py)")
    args, rest = parser.parse_known_args(argv)
    if args.batch_sizes:
        import bench_batch

        return bench_batch.main(["--run", args.run, "--hardware", args.hardware or "",
                                 "--batch-sizes", *map(str, args.batch_sizes),
                                 "--prompts", str(args.prompts), "--repeats", str(args.repeats),
                                 "--max-new-tokens", str(args.max_new_tokens),
                                 "--threads", str(args.threads or 1),
                                 *(["--json"] if args.json else []),
                                 *(["--out", args.out] if args.out else []), *rest])
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    result = bench(args.run, hardware=args.hardware, prompts=args.prompts,
                   max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                   assistant=args.assistant, hf_lookup_tokens=args.hf_lookup_tokens,
                   threads=args.threads, hf_compile_backend=args.hf_compile_backend)
    # --json: one line on stdout, the table on stderr
    out = sys.stderr if args.json else sys.stdout
    print(f"target {result['target'].get('path') or result['target'].get('id')}; hardware "
          f"{result['hardware_id']}; {result['prompts']} built-in eval prompts, max "
          f"{result['max_new_tokens']} new tokens, median of {result['repeats']} interleaved "
          f"passes, torch {result['torch']} with {result['threads']} threads\n", file=out)
    print(result["table"], file=out)
    if result["assistant_vision_calls"] is not None:
        print(f"\nThe assistant's vision tower ran {result['assistant_vision_calls']} times in all "
              "assisted runs (0: HF drafted without the image).", file=out)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
