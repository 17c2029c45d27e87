"""`dreams-nas train`: self-distil the target, choose the AIFD layer, train the supernet (TPPT)."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import add_data, add_device, add_dtype, real, whole
from dreams_nas.supernet.core.errors import InputError


def shares(text: str) -> tuple[float, ...]:
    """An argparse type: comma-separated shares in (0, 1], e.g. ``0.25,0.5,1``."""
    parse = real(0.0, 1.0, low_open=True)
    values = tuple(parse(part.strip()) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} lists no share; give e.g. 0.25,0.5,1")
    return values


HELP = "train the DREAM-S supernet draft on a target (self-distillation, AIFD, two-phase training)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="builtin", metavar="builtin|ID|PATH",
                        help="the target VLM: builtin (the built-in target), proxy-llava (the "
                             "real-shaped random-weight proxy: 576 visual tokens, a 32k "
                             "vocabulary, a 0.3B LM), a hub id or a checkpoint folder")
    add_data(parser, "training prompts")
    parser.add_argument("--n-train", type=whole(1), default=None, metavar="N",
                        help="use the first N prompts (builtin: how many to synthesise; "
                             "default 384)")
    _add_schedule(parser.add_argument_group("schedule"))
    _add_losses(parser.add_argument_group("losses"))
    _add_supernet(parser.add_argument_group("the supernet"))
    parser.add_argument("--max-new-tokens", type=whole(1), default=64, metavar="N",
                        help="length cap of the target's self-distilled answers")
    add_device(parser, "to train on (the target and the draft)")
    add_dtype(parser)


def _add_schedule(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--warmup-steps", type=whole(0), default=None, metavar="N",
                        help="phase 1 steps, full draft (default 300)")
    parser.add_argument("--multires-steps", type=whole(0), default=None, metavar="N",
                        help="phase 2 steps at most, sandwich rule over subnets; with held-out "
                             "prompts it stops earlier at a plateau (default 400)")
    parser.add_argument("--batch-size", type=whole(1), default=None, metavar="N", help="default 8")
    parser.add_argument("--unroll", type=whole(0, 15), default=None, metavar="N",
                        help="drafting steps after the first trained on the draft's own "
                             "features (training-time test; default: the space's deepest "
                             "chain or tree minus 1, 6 for draft_len 7)")
    parser.add_argument("--lr", type=real(0.0, low_open=True), default=None,
                        help="peak learning rate (default 2e-3)")
    parser.add_argument("--inplace-distill", type=real(0.0, 1.0), default=None, metavar="W",
                        help="phase 2: weight of the largest subnet's distribution in the "
                             "sampled subnets' KL (in-place distillation; default 0.5; 0: the "
                             "target's only)")
    parser.add_argument("--ema-decay", type=real(0.0, 1.0, high_open=True), default=None,
                        metavar="D",
                        help="phase 2: average the weights (EMA) with decay D; held-out tau "
                             "scores the average and the run keeps it (default 0: no average)")
    parser.add_argument("--phase1-depths", choices=("both", "deepest"), default=None,
                        help="phase 1 with --depth above 1: train the one-layer draft beside "
                             "the deepest on every step (both; default) or the deepest only")
    parser.add_argument("--phase2-depths", choices=("anchored", "sandwich"), default=None,
                        help="phase 2 with --depth above 1: the sandwich rule (largest, "
                             "smallest, random) plus the one-layer draft with all heads and "
                             "the whole MLP on every step (anchored; default) or the sandwich "
                             "alone")
    parser.add_argument("--holdout", type=whole(0), default=None, metavar="N",
                        help="training prompts held out to judge convergence (default: an "
                             "eighth, at most 32; 0 trains to the step cap)")
    parser.add_argument("--eval-every", type=whole(1), default=None, metavar="N",
                        help="steps between held-out tau evaluations (default 50)")
    parser.add_argument("--patience", type=whole(1), default=None, metavar="N",
                        help="stop phase 2 after N evaluations without a gain above "
                             "--tolerance (default 3)")
    parser.add_argument("--tolerance", type=real(0.0), default=None, metavar="TAU",
                        help="the held-out tau gain that counts as progress (default 0.02)")
    parser.add_argument("--time-budget", type=real(0.0, low_open=True), default=None,
                        metavar="SECONDS",
                        help="stop optimising after this long and keep the best evaluation "
                             "(default: no limit but the step caps)")


def _add_losses(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--lambda-kl", type=real(0.0), default=None,
                        help="weight of KL(target||draft) (1.0)")
    parser.add_argument("--lambda-distill", type=real(0.0), default=None,
                        help="weight of the AIFD feature distillation (0.2)")
    parser.add_argument("--lambda-feat", type=real(0.0), default=None,
                        help="weight of the final-feature regression (0.2)")
    parser.add_argument("--distill", choices=("aifd", "middle", "last", "none"),
                        default="aifd", help="distillation layer: AIFD-chosen (default), fixed "
                                             "middle, the last layer, or none")


def _add_supernet(parser: argparse._ArgumentGroup) -> None:
    parser.add_argument("--visual-context", choices=("self", "cross"), default="self",
                        help="where the draft reads the kept visual tokens: self (its own "
                             "sequence, where each kept token costs attention on every step, "
                             "and the cross-attention memory; default) or cross (the memory "
                             "only)")
    parser.add_argument("--depth", type=whole(1), default=None, metavar="N",
                        help="decoder layers on each side of the draft's cross-attention in the "
                             "largest subnet; subnets search depths 1..N (default 1, the "
                             "paper's draft; 3 with --mlp 0.25,0.5,1 trains elastic depth "
                             "and width)")
    parser.add_argument("--mlp", type=shares, default=None, metavar="SHARES",
                        help="MLP widths the supernet trains and the search picks from, as "
                             "shares of the channels, e.g. 0.25,0.5,1 (default 1: the whole "
                             "MLP only)")
    parser.add_argument("--draft-vocab", type=shares, default=None, metavar="SHARES",
                        help="draft vocabularies the search picks from, as shares of the "
                             "target's vocabulary, its most frequent tokens in the "
                             "self-distilled answers first (FR-Spec), e.g. 0.25,1 (default: "
                             "0.25,1 for a vocabulary of 16,000 tokens or more, else 1)")
    parser.add_argument("--heads", type=whole(1), default=None, metavar="N",
                        help="heads of the maximal draft (default: the target's)")


def check_arguments(args: argparse.Namespace) -> None:
    """What can be refused before anything loads: a loss that is zero whatever the draft does,
    and a data file that cannot be read (every line is parsed now, not after the target load)."""
    from dreams_nas.supernet.data.prompts import check_data

    distill_off = args.lambda_distill == 0 or args.distill == "none"
    if args.lambda_kl == 0 and args.lambda_feat == 0 and distill_off:
        raise InputError(
            "--lambda-kl 0 --lambda-feat 0 with "
            + ("--distill none" if args.distill == "none" else "--lambda-distill 0")
            + " leaves no loss to train on; give at least one of --lambda-kl, --lambda-distill, "
            "--lambda-feat a weight above 0")
    check_data(args.data)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.stages.train import TrainOptions, train
    from dreams_nas.supernet.core.runfolder import RunFolder

    check_arguments(args)
    options = TrainOptions(
        target=args.target, data=args.data, n_train=args.n_train,
        warmup_steps=args.warmup_steps, multires_steps=args.multires_steps,
        batch_size=args.batch_size, unroll=args.unroll, lr=args.lr,
        inplace_distill=args.inplace_distill, ema_decay=args.ema_decay,
        phase1_shallowest=None if args.phase1_depths is None else args.phase1_depths == "both",
        phase2_shallowest=(None if args.phase2_depths is None
                           else args.phase2_depths == "anchored"),
        eval_every=args.eval_every,
        patience=args.patience, tolerance=args.tolerance, time_budget=args.time_budget,
        holdout=args.holdout, lambda_kl=args.lambda_kl,
        lambda_distill=args.lambda_distill, lambda_feat=args.lambda_feat, distill=args.distill,
        heads=args.heads, visual_context=args.visual_context, depth=args.depth, mlp=args.mlp,
        draft_vocab=args.draft_vocab, max_new_tokens=args.max_new_tokens, device=args.device,
        dtype=args.dtype,
        seed=args.seed, show_progress=False if args.json or args.quiet else None)
    return train(RunFolder(args.run), options)
