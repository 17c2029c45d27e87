"""Each step the profile prices, timed as the profile times it and inside real decoding.

    dreams-nas search --run dreams-run          # first: a run with a supernet and a best.json
    python benchmarks/bench_draft_chain.py --run dreams-run [--spec h3-v1.00-l8-g7]
        [--prompts 8] [--max-new-tokens 64] [--rounds 5] [--repeats 40] [--threads 1]

The expected-speedup formula prices plain decoding by the target's one-token step and a cycle
of draft_len drafts by one first draft step (over the previous cycle's accepted tokens, right after
the target's verify), draft_len - 1 later steps and the verify over draft_len + 1 positions. This
benchmark times what those prices should be -- each prompt decoded plainly and then by the
subnet through `supernet.decoding.loop.generate`, every target `verify` call and every forward
and `logits` call of the drafter timed with `perf_counter` (a cycle's first forward with its
first `logits` is its first step; each later forward with the next `logits` a later step) --
and, in the same rounds, the profile's step builder (`latency.measure.steps.ModelSteps`) at the
loop's mean context:

* ``hot``: the profile's ``draft`` step, timed back to back (3 warm-ups, then the repeats);
* ``chain``: the same step with each repeat prepared (untimed) as the loop prepares a cycle's
  later step: the target's verify, then the first draft step on the same draft cache and
  memory (`ModelSteps(chain_drafts=True)`);
* ``first``: the profile's ``draft_first`` step, each repeat prepared by the verify;
* ``decode``: the profile's ``decode`` step (back to back);
* ``verify``: the profile's ``verify`` over draft_len + 1 positions, each repeat prepared by the
  space's largest subnet's draft steps.

The loop's draft steps are its forward and `logits` calls alone; the builder's add the argmax
and the cache crop (which the profile's ``cycle`` kind prices among the loop's own work), so
a builder step a few per cent above the loop's is the expected agreement.

Each round decodes the prompts, then times the builder's steps (`--repeats` samples each), so
a change of the machine's speed falls on all of them. The table gives per round the p10 and
the median of each, then each builder step's ratio to the loop's step it prices (medians over
the rounds, and their range); the last line is the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch


class _Recorder:
    """The drafter's forward and `logits` calls of one decoding, timed, in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.target: list[tuple[int, float]] = []  # (positions, ms) of each target verify

    def timed(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        self.calls.append((name, (time.perf_counter_ns() - start) / 1e6))
        return out

    def steps(self) -> tuple[list[float], list[float]]:
        """(first steps, later steps) in ms: a cycle opens with a forward over its accepted
        tokens; each forward is paired with the `logits` call after it."""
        first: list[float] = []
        later: list[float] = []
        pending: tuple[bool, float] | None = None
        opening = True
        for name, ms in self.calls:
            if name == "forward":
                pending = (opening, ms)
                opening = False
            elif name == "logits" and pending is not None:
                (first if pending[0] else later).append(pending[1] + ms)
                pending = None
            elif name == "propose":  # a new cycle (an unpaired forward before it: the
                opening, pending = True, None  # draft's pass over the prompt, not a step)
        return first, later


class _TimedTarget:
    """The target adapter with each `verify` call's positions and time recorded (plain
    decoding calls it over one position, a cycle over its drafts and the last token)."""

    def __init__(self, adapter: Any, recorder: _Recorder) -> None:
        self._adapter, self._recorder = adapter, recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    def verify(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        out = self._adapter.verify(tokens, *args, **kwargs)
        self._recorder.target.append((int(tokens.shape[1]),
                                      (time.perf_counter_ns() - start) / 1e6))
        return out


class _TimedDraft:
    def __init__(self, draft: Any, recorder: _Recorder) -> None:
        self._draft, self._recorder = draft, recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._draft, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._recorder.timed("forward", self._draft, *args, **kwargs)

    def logits(self, *args: Any, **kwargs: Any) -> Any:
        return self._recorder.timed("logits", self._draft.logits, *args, **kwargs)


class _MarkedDrafter:
    """The drafter, each `propose` marked in the recording (a new cycle's first step) with the
    target's context length then."""

    def __init__(self, drafter: Any, recorder: _Recorder, target: Any,
                 contexts: list[int]) -> None:
        self._drafter, self._recorder = drafter, recorder
        self._target, self._contexts = target, contexts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._drafter, name)

    def propose(self, *args: Any, **kwargs: Any) -> Any:
        self._recorder.calls.append(("propose", 0.0))
        self._contexts.append(int(self._target.cache_len))
        return self._drafter.propose(*args, **kwargs)


def _stats(samples: list[float]) -> tuple[float, float]:
    return float(np.percentile(samples, 10)), float(np.median(samples))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="dreams-run")
    parser.add_argument("--hardware", default=None)
    parser.add_argument("--spec", default=None, help="subnet id (default: best.json's)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dreams_nas.latency.measure.plan import StepKey
    from dreams_nas.latency.measure.steps import ModelSteps
    from dreams_nas.latency.measure.timing import Repeats, measure
    from dreams_nas.nas.stages.inputs import RunModels, load_eval_examples, resolve_hardware
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.loop import generate
    from dreams_nas.supernet.draft.extract import extract

    run = RunFolder(args.run)
    hw = resolve_hardware(run, args.hardware)
    if args.spec:
        spec = SubnetSpec.from_id(args.spec)
    else:
        spec = SubnetSpec.from_dict(json.loads(run.best_json(hw).read_text())["spec"])
    if spec.is_tree:
        parser.error(f"--spec {spec.id} drafts a token tree; give a chain (its steps are "
                     "what the profile's draft kind prices)")
    plan = json.loads((run.latency_dir(hw) / "plan.json").read_text())
    space = run.space()
    models = RunModels(run, "cpu")
    target, supernet = models.target, models.draft
    examples = load_eval_examples("builtin", args.prompts, 0)
    prompts = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
    draft = extract(supernet, spec)
    recorder = _Recorder()
    contexts: list[int] = []

    timed_target = _TimedTarget(target, recorder)

    def decode_all() -> None:
        for prompt in prompts:  # plainly, then speculatively, as the search's verification
            generate(timed_target, dict(prompt), None,  # type: ignore[arg-type]
                     max_new_tokens=args.max_new_tokens)
            drafter = DreamDrafter(draft, spec)
            drafter.draft = _TimedDraft(drafter.draft, recorder)  # type: ignore[assignment]
            marked = _MarkedDrafter(drafter, recorder, target, contexts)
            generate(timed_target, dict(prompt), marked,  # type: ignore[arg-type]
                     shape=spec.draft_len, max_new_tokens=args.max_new_tokens)

    decode_all()  # warm-up, and the loop's contexts
    context = int(round(statistics.mean(contexts)))
    canonical = spec.replace(draft_len=max(space.draft_len))
    steps = ModelSteps(target, supernet, int(plan.get("visual_tokens", 0)),
                       seed=int(plan.get("seed", 0)), precede=space.largest())
    key = StepKey("draft", context, 1, canonical)
    k = spec.draft_len + 1  # the loop's verify width (but where the answer's budget ends)

    def chained(draft_key: Any) -> Any:
        steps.chain_drafts = True
        try:
            return steps.build(draft_key)
        finally:
            steps.chain_drafts = False  # the profile's way

    def timed(step: Any) -> list[float]:
        timing = measure(step.run, Repeats(warmup=3, min_repeats=args.repeats,
                                           max_repeats=args.repeats, budget_s=1e-3),
                         threads=args.threads, prepare=step.prepare)
        return list(timing.samples_ms)

    builders = {"hot": lambda: steps.build(key), "chain": lambda: chained(key),
                "first": lambda: steps.build(StepKey("draft_first", context, 1, canonical)),
                "decode": lambda: steps.build(StepKey("decode", context, 1)),
                "verify": lambda: steps.build(StepKey("verify", context, k))}
    pairs = (("hot", "loop_later"), ("chain", "loop_later"), ("first", "loop_first"),
             ("decode", "loop_decode"), ("verify", "loop_verify"))
    columns = ("loop_first", "loop_later", "hot", "chain", "first", "loop_decode", "decode",
               "loop_verify", "verify")
    print(f"{spec.id} (priced as {canonical.id}) at context {context} (the loop's mean); "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens; {args.threads} thread(s); "
          f"p10 / median ms; verify over {k} positions")
    print(f"{'round':>5} " + " ".join(f"{c:>14}" for c in columns))
    rows = []
    for r in range(args.rounds):
        recorder.calls.clear()
        recorder.target.clear()
        decode_all()
        loop_first, loop_later = recorder.steps()
        samples = {"loop_first": loop_first, "loop_later": loop_later,
                   "loop_decode": [ms for n, ms in recorder.target if n == 1],
                   "loop_verify": [ms for n, ms in recorder.target if n == k]}
        samples.update({name: timed(build()) for name, build in builders.items()})
        row = {name: _stats(v) for name, v in samples.items()}
        rows.append(row)
        print(f"{r + 1:>5} " + " ".join(f"{row[c][0]:6.3f}/{row[c][1]:6.3f}" for c in columns))
    summary: dict[str, Any] = {"spec": spec.id, "context": context, "rounds": args.rounds,
                               "threads": args.threads}
    for stat, i in (("p10", 0), ("median", 1)):
        parts = []
        for builder, loop in pairs:
            values = [row[builder][i] / row[loop][i] for row in rows]
            name = f"{builder}_over_{loop}_{stat}"
            summary[name] = round(statistics.median(values), 3)
            summary[f"{name}_range"] = [round(min(values), 3), round(max(values), 3)]
            parts.append(f"{builder} / {loop} {summary[name]:.2f} "
                         f"({min(values):.2f}-{max(values):.2f})")
        print(f"{stat}: " + ", ".join(parts))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
