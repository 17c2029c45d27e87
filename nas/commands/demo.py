"""`dreams-nas demo`: the whole pipeline on the built-in target, every artefact reused."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import (
    add_compile,
    add_device,
    add_dtype,
    add_threads,
    whole,
)
from dreams_nas.nas.commands.train import shares
from dreams_nas.supernet.core.targets import BUILTIN, NAMED_TARGETS

HELP = ("the whole pipeline on the built-in target: build it, train, profile, score, "
        "search, verify, report (a rerun reuses every artefact)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=NAMED_TARGETS, default=BUILTIN,
                        help="builtin: the trained built-in target (default); proxy-llava: the "
                             "real-shaped random-weight proxy (576 visual tokens, a 32k "
                             "vocabulary, a 0.3B LM: real costs, meaningless tau; give small "
                             "stage options)")
    add_device(parser, "to train, profile, score and verify on")
    add_dtype(parser)
    add_compile(parser, "profile, search and verify the steps compiled")
    add_threads(parser, "while profiling", default="physical cores")
    parser.add_argument("--no-report", action="store_true",
                        help="skip the report stage (`dreams-nas report` writes it later)")
    small = parser.add_argument_group(
        "smaller stages (for tests and quick looks; the defaults are the real pipeline; "
        "DREAMS_NAS_DEMO_VARIANT=tiny selects the test-size built-in target, whose demo "
        "takes test sizes for the options not given: 16 prompts, 20 + 20 steps, a profile "
        "budget of 16 at 3 repeats, 4 prompts of 16 new tokens, 2 verified)")
    small.add_argument("--train-prompts", type=whole(1), default=None, metavar="N",
                       help="supernet training prompts (default 384)")
    small.add_argument("--train-steps", type=whole(0), default=None, metavar="N",
                       help="steps of each supernet training phase (default 300 + 300)")
    small.add_argument("--depth", type=whole(1), default=None, metavar="N",
                       help="decoder layers a side of the largest draft, as `dreams-nas train "
                            "--depth` (default 1)")
    small.add_argument("--mlp", type=shares, default=None, metavar="SHARES",
                       help="MLP widths trained and searched, as `dreams-nas train --mlp` "
                            "(demo default 1)")
    small.add_argument("--draft-vocab", type=shares, default=None, metavar="SHARES",
                       help="draft vocabularies searched, as `dreams-nas train --draft-vocab` "
                            "(default: 0.25,1 for a vocabulary of 16,000 tokens or more)")
    small.add_argument("--profile-budget", default=None, metavar="N|FRACTION",
                       help="draft measurements of the profile (default: the whole grid)")
    small.add_argument("--repeats", type=whole(1), default=None, metavar="N",
                       help="timed repeats per profiled step, in 4 passes (default 40)")
    small.add_argument("--warmup", type=whole(0), default=3, metavar="N",
                       help="untimed runs of a profiled step before each pass (default 3)")
    small.add_argument("--context-lengths", type=whole(1), nargs="+", default=None, metavar="N",
                       help="profiled prompt lengths (default: five from the shortest "
                            "evaluation prompt to the longest plus --max-new-tokens)")
    small.add_argument("--limit", type=whole(1), default=None, metavar="N",
                       help="evaluation prompts scored (default 32)")
    small.add_argument("--max-new-tokens", type=whole(1), default=None, metavar="N",
                       help="tokens per prompt when training, scoring and verifying (default 64)")
    small.add_argument("--verify-prompts", type=whole(1), default=None, metavar="N",
                       help="prompts decoded to verify the best subnets (default: all scored)")
    small.add_argument("--verify-repeats", type=whole(1), default=1, metavar="R",
                       help="passes over them, interleaved; the measured speedup is the median "
                            "(default 1, to keep the demo short; `search` takes 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.stages.demo import DemoOptions, run_demo
    from dreams_nas.nas.stages.train import TrainOptions

    # the sizes not given are the target variant's demo sizes (`stages.demo.sized`), and
    # training decodes the demo's --max-new-tokens
    train = TrainOptions(n_train=args.train_prompts, warmup_steps=args.train_steps,
                         multires_steps=args.train_steps, depth=args.depth, mlp=args.mlp,
                         draft_vocab=args.draft_vocab)
    options = DemoOptions(
        device=args.device, dtype=args.dtype, seed=args.seed, target=args.target, train=train,
        compile=args.compile,
        profile_budget=args.profile_budget,
        profile_repeats=args.repeats, profile_warmup=args.warmup,
        context_lengths=tuple(args.context_lengths) if args.context_lengths else None,
        threads=args.threads, limit=args.limit, max_new_tokens=args.max_new_tokens,
        verify_prompts=args.verify_prompts, verify_repeats=args.verify_repeats,
        report=not args.no_report, show_progress=False if args.json or args.quiet else None)
    summary = run_demo(args.run, options)
    if not args.json:
        print(format_summary(summary), flush=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The few lines a person reads at the end of the demo."""

    def x(value: Any) -> str:
        return f"{value:.2f}x" if isinstance(value, int | float) else "not measured"

    reused = [name for name, state in summary["stages"].items() if state == "reused"]
    return "\n".join([
        f"best subnet  {summary['best']}  ({summary['spec_dir']})",
        f"speedup      predicted {x(summary['predicted_speedup'])}, measured "
        f"{x(summary['measured_speedup'])} in the decode phase "
        f"({x(summary.get('measured_speedup_end_to_end'))} over whole calls, prefill included) "
        "vs plain greedy decoding",
        f"tau          predicted {summary['predicted_tau']}, measured {summary['measured_tau']}",
        f"report       {summary['report'] or 'not written (--no-report)'}",
        f"took         {summary['seconds']:.0f} s"
        + (f" (reused: {', '.join(reused)})" if reused else ""),
    ])
