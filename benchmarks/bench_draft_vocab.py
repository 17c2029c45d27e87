"""What the draft vocabulary saves on a real-shaped target, and that decoding stays lossless.

    python benchmarks/bench_draft_vocab.py [--target proxy-llava] [--dtype bfloat16]
        [--threads 1] [--context 650] [--passes 5] [--repeats 10] [--prompts 2]

On the proxy target (LLaVA-1.5 geometry, a 32,000-token vocabulary, hidden 1024; or any target
`--target` names), a DREAM-S supernet offering draft vocabularies 0.25 and 1.0 of the target's
tokens is built from the target's config (a step's cost does not depend on the weights). The
draft steps the profile times (`latency.measure.steps.ModelSteps`, kinds ``draft`` and
``draft_first`` of the extracted subnet: its layers, its head rows, the argmax) are timed for the
largest and the smallest heads at both vocabularies, interleaved over `--passes` passes of
`--repeats` repeats each with `latency.measure.timing.measure`; medians and the range of the pass
medians are printed with the ratio full / draft vocabulary. Then `--prompts` built-in prompts are
decoded greedily by the target alone and with the draft-vocabulary subnet (its order ranked by the
plain answers' token frequency): the outputs must be identical token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="proxy-llava")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=650)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from dreams_nas.latency.measure.plan import StepKey
    from dreams_nas.latency.measure.steps import ModelSteps, build_supernet, visual_tokens_of
    from dreams_nas.latency.measure.timing import Repeats, measure
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.space import SearchSpace, vocab_rows
    from dreams_nas.supernet.target.adapter import TargetAdapter

    dtype = getattr(torch, args.dtype)
    adapter = TargetAdapter.load(resolve_target(args.target), target_id=args.target,
                                 device="cpu", dtype=dtype)
    text = adapter.text_config
    vocab = int(text.vocab_size)
    space = SearchSpace.default_for(int(text.num_hidden_layers), int(text.num_attention_heads),
                                    trees=(), draft_vocab=(0.25, 1.0))
    supernet = build_supernet(adapter.model, space)
    builder = ModelSteps(adapter, supernet, visual_tokens_of(adapter.model.config))
    layer = max(space.inject_layer)
    configs = [(kind, h, share) for kind in ("draft", "draft_first")
               for h in (min(space.heads), max(space.heads)) for share in (0.25, 1.0)]
    steps = {}
    for kind, h, share in configs:
        spec = space.largest().replace(heads=h, inject_layer=layer, draft_vocab=share)
        steps[(kind, h, share)] = builder.build(StepKey(kind, args.context, 1, spec))
    samples: dict[tuple, list[float]] = {c: [] for c in configs}
    medians: dict[tuple, list[float]] = {c: [] for c in configs}
    for _ in range(args.passes):
        for config in configs:
            step = steps[config]
            timing = measure(step.run, Repeats(min_repeats=args.repeats,
                                               max_repeats=args.repeats, budget_s=60.0),
                             prepare=step.prepare, threads=args.threads)
            samples[config] += list(timing.samples_ms)
            medians[config].append(statistics.median(timing.samples_ms))
    rows = []
    for kind, h, share in configs:
        if share != 0.25:
            continue
        part, full = samples[(kind, h, 0.25)], samples[(kind, h, 1.0)]
        rows.append({"kind": kind, "heads": h, "context": args.context,
                     "rows_draft_vocab": vocab_rows(vocab, 0.25), "rows_full": vocab,
                     "ms_draft_vocab": round(statistics.median(part), 3),
                     "ms_full": round(statistics.median(full), 3),
                     "range_draft_vocab": [round(min(medians[(kind, h, 0.25)]), 3),
                                           round(max(medians[(kind, h, 0.25)]), 3)],
                     "range_full": [round(min(medians[(kind, h, 1.0)]), 3),
                                    round(max(medians[(kind, h, 1.0)]), 3)],
                     "full_over_draft_vocab": round(statistics.median(full)
                                                    / statistics.median(part), 3)})
    for row in rows:
        print(json.dumps(row), flush=True)
    print(json.dumps(lossless(adapter, supernet, space, layer, args)), flush=True)
    return 0


def lossless(adapter, supernet, space, layer: int, args: argparse.Namespace) -> dict:
    """Greedy decoding with the draft-vocabulary subnet equals the target's own."""
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.training.selfdistill import prompt_inputs
    from dreams_nas.supernet.training.vocab import coverage, frequency_order

    prompts = list(prompt_inputs(adapter, load_eval_examples("builtin", args.prompts, seed=0)))
    plain = [plain_generate(adapter, p, max_new_tokens=args.max_new_tokens) for p in prompts]
    answers = [r.tokens for r in plain]
    order = frequency_order(answers, int(adapter.text_config.vocab_size))
    supernet.set_vocab_order(order)
    spec = space.largest().replace(inject_layer=layer, draft_len=4, draft_vocab=0.25)
    compact = extract(supernet, spec)
    same = []
    for prompt, ref in zip(prompts, plain, strict=True):
        out = generate(adapter, prompt, DreamDrafter(compact, spec), shape=spec.draft_len,
                       max_new_tokens=args.max_new_tokens)
        same.append(out.tokens.tolist() == ref.tokens.tolist())
    rows = supernet.vocab_rows_of(spec)
    return {"lossless_prompts": len(same), "identical": all(same), "spec": spec.id,
            "answer_coverage": round(coverage(answers, order, rows), 4)}


if __name__ == "__main__":
    sys.exit(main())
