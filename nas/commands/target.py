"""`dreams-nas target build-builtin|build-proxy`: build (once) and cache a named target: the
built-in target or a real-shaped proxy."""

from __future__ import annotations

import argparse
from typing import Any

from dreams_nas.nas.commands.options import add_threads
from dreams_nas.supernet.core.targets import PROXY_TARGETS

HELP = ("the named targets: `target build-builtin` trains the built-in target once and "
        "caches it; "
        "`target build-proxy` builds a real-shaped random-weight proxy (seconds)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("build-builtin", "build-proxy"),
                        help="build-builtin: train the built-in target (a small LLaVA on the "
                             "synthetic tasks) into $DREAMS_NAS_CACHE (default "
                             "~/.cache/dreams-nas) once; later calls return the cached one at "
                             "once. build-proxy: build the proxy named by --proxy the same way")
    parser.add_argument("--proxy", choices=PROXY_TARGETS, default=PROXY_TARGETS[0],
                        help="build-proxy: which proxy (default: proxy-llava; "
                             "proxy-llava-tiny is its test-size twin)")
    parser.add_argument("--variant", choices=("default", "assistant", "tiny"), default="default",
                       help="`tiny` is the seconds-long test-size build; `assistant` the 2-layer "
                            "same-family model the peer benchmark gives HF assisted generation "
                            "(default: default)")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="cache folder (default: $DREAMS_NAS_CACHE or ~/.cache/dreams-nas)")
    add_threads(parser, "for the build")
    parser.add_argument("--rebuild", action="store_true",
                        help="build afresh even when a valid cached build exists (benchmarking)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.supernet.builtin.cache import ensure_builtin_target_with_metrics
    from dreams_nas.supernet.core.errors import InputError

    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads {args.threads} must be at least 1")
    if args.action == "build-proxy":
        return _build_proxy(args)
    folder, metrics, cached = ensure_builtin_target_with_metrics(
        args.cache_dir, variant=args.variant, seed=args.seed, progress=not args.quiet,
        threads=args.threads, rebuild=args.rebuild)
    keys = ("exact_match", "exact_match_per_task", "num_params", "decode_ms_target",
            "decode_ms_draft_1layer", "decode_ms_draft_3layer", "draft_1layer_to_target",
            "draft_3layer_to_target", "build_s", "train_steps", "num_layers", "hidden_size",
            "variant", "version")
    summary = {key: metrics.get(key) for key in keys}
    summary.update(folder=str(folder), cached=cached)
    return summary


def _build_proxy(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.supernet.builtin.cache import ensure_proxy_target

    folder, metrics, cached = ensure_proxy_target(args.proxy, args.cache_dir, seed=args.seed,
                                                  rebuild=args.rebuild)
    keys = ("name", "version", "num_params", "num_params_text", "num_params_lm_head",
            "visual_tokens", "vocab_size", "num_layers", "hidden_size", "dtype", "build_s")
    return {**{key: metrics.get(key) for key in keys}, "folder": str(folder), "cached": cached}
