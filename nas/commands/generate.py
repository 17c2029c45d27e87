"""`dreams-nas generate`: answer one question about one image with speculative decoding."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dreams_nas.nas.commands.options import add_compile, add_device, add_dtype, real, whole
from dreams_nas.supernet.core.errors import InputError

HELP = ("generate an answer about an image with a target VLM and a drafter "
        "(lossless speculative decoding)")

_NAMED_DRAFTERS = ("lookup", "oracle", "none")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="builtin", metavar="ID|PATH",
                        help="hub id, checkpoint folder, builtin (the built-in target) or "
                             "proxy-llava (the real-shaped random-weight proxy) "
                             "(default: builtin)")
    parser.add_argument("--image", default=None, metavar="FILE", help="PNG/JPEG image")
    parser.add_argument("--prompt", default=None, metavar="TEXT",
                        help="the question about the image")
    parser.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                        help="many requests instead of --image/--prompt: LLaVA-style JSONL "
                             "(image paths relative to the file); one JSON line per request, "
                             "in input order, to --out")
    parser.add_argument("--batch-size", type=whole(1), default=1, metavar="B",
                        help="with --prompts: requests decoded together (default 1)")
    parser.add_argument("--out", default="-", metavar="FILE",
                        help="with --prompts: where the request lines go (default: stdout)")
    parser.add_argument("--drafter", default=None, metavar="lookup|oracle|none|SPEC_DIR",
                        help="prompt lookup (default for one request; none with --prompts), "
                             "the oracle (target's greedy continuation), "
                             "none (plain decoding), or a spec folder written by "
                             "`dreams-nas search`")
    parser.add_argument("--draft-len", type=whole(1, 64), default=None, metavar="N",
                        help="tokens drafted per cycle (default: the spec's draft_len, else 5)")
    parser.add_argument("--tree", default=None, metavar="SHAPE",
                        help="draft a token tree each cycle: children per level, e.g. 4x2x1 "
                             "(default: the spec's tree; a chain otherwise)")
    parser.add_argument("--temperature", type=real(0.0), default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=real(0.0, 1.0, low_open=True), default=1.0,
                        help="nucleus sampling mass (default 1.0 = off)")
    parser.add_argument("--top-k", type=whole(0), default=0,
                        help="keep the k most likely tokens (default 0 = off)")
    parser.add_argument("--max-new-tokens", type=whole(1), default=64, metavar="N")
    add_device(parser, "to decode on")
    add_dtype(parser, default="a spec folder's dtype, else auto")
    add_compile(parser)


def _check_args(args: argparse.Namespace) -> Any:
    """Everything that can be checked before the (slow) model load; returns the opened image
    (None with --prompts)."""
    if args.drafter is None:
        args.drafter = "none" if args.prompts is not None else "lookup"
    if args.prompts is not None:
        _check_batch_args(args)
    elif args.image is None or args.prompt is None:
        raise InputError("give --image FILE and --prompt TEXT, or --prompts FILE.jsonl for many "
                         "requests")
    elif args.out != "-":
        raise InputError(f"--out {args.out} is for --prompts' request lines; one request's "
                         "answer goes to stdout (--json for its summary)")
    if args.draft_len is not None and args.draft_len < 1:
        raise InputError(f"--draft-len {args.draft_len} must be >= 1; use --drafter none for "
                         "plain decoding")
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
    if args.tree is not None:
        from dreams_nas.supernet.core.tree import TokenTree

        tree = TokenTree.parse(args.tree)
        if args.draft_len is not None and args.draft_len != tree.draft_len:
            raise InputError(f"--draft-len {args.draft_len} and --tree {tree.label} (draft_len "
                             f"{tree.draft_len}) disagree; give one of them")
    if args.drafter not in _NAMED_DRAFTERS and not Path(args.drafter).expanduser().is_dir():
        raise InputError(f"unknown drafter {args.drafter!r}; pick lookup, oracle, none or the path "
                         "of a spec folder (specs/<spec_id>/ in the run folder)")
    if args.prompts is not None:
        return None
    from dreams_nas.supernet.target.images import open_image

    return open_image(args.image)


def _check_batch_args(args: argparse.Namespace) -> None:
    if args.image is not None or args.prompt is not None:
        raise InputError("--prompts FILE.jsonl holds every request's image and question; drop "
                         "--image/--prompt, or drop --prompts for one request")
    if not Path(args.prompts).expanduser().is_file():
        raise InputError(f"--prompts {args.prompts}: no such file; give a LLaVA-style .jsonl "
                         "file (one request per line)")
    if args.drafter in ("lookup", "oracle"):
        raise InputError(f"--drafter {args.drafter} drafts one request at a time; with "
                         "--prompts draft with a spec folder (specs/<spec_id>/) or none")


def check_positions(prompt_len: int, max_new_tokens: int, max_positions: int | None) -> None:
    """Refuse a request that runs past the target's last position (its text config's
    `max_position_embeddings`): past it the rotary positions are out of the trained range and
    the output is garbage, or an index error deep in the model. None: no stated limit."""
    if max_positions is None or prompt_len + max_new_tokens <= max_positions:
        return
    left = max_positions - prompt_len
    fix = (f"give --max-new-tokens {left} or fewer" if left >= 1
           else "shorten the prompt (or use a smaller image)")
    raise InputError(f"the prompt's {prompt_len} tokens (image included) + --max-new-tokens "
                     f"{max_new_tokens} = {prompt_len + max_new_tokens} exceeds the target's "
                     f"{max_positions} positions (max_position_embeddings); {fix}")


def _dtype_of(args: argparse.Namespace, device: str) -> str:
    """--dtype, else the spec folder's dtype, else auto; a spec's own dtype is the only one it
    loads in (`load_spec_drafter` refuses another, naming both)."""
    from dreams_nas.supernet.core.device import resolve_dtype
    from dreams_nas.supernet.decoding.spec import spec_dtype

    exported = None
    if args.drafter not in _NAMED_DRAFTERS:
        exported = spec_dtype(Path(args.drafter).expanduser())
    if args.dtype in (None, "auto") and exported is not None:
        return exported
    return resolve_dtype(args.dtype, device)


def run(args: argparse.Namespace) -> dict[str, Any]:
    image = _check_args(args)
    import torch
    from dreams_nas.supernet.decoding.loop import generate
    from dreams_nas.supernet.decoding.registry import load_drafter
    from dreams_nas.supernet.decoding.sampling import SamplingConfig
    from dreams_nas.supernet.target.adapter import TargetAdapter

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    from dreams_nas.supernet.core.device import resolve_compile, resolve_device, torch_dtype

    device = resolve_device(args.device)
    steps = resolve_compile(args.compile, device)
    from dreams_nas.supernet.builtin.resolve import resolve_target

    target = TargetAdapter.load(resolve_target(args.target), target_id=args.target,
                                device=device, dtype=torch_dtype(_dtype_of(args, device)))
    target.use_steps(steps)
    if args.prompts is not None:
        return _run_file(args, target, sampling, steps)
    inputs = target.build_inputs(image, args.prompt)
    check_positions(int(inputs["input_ids"].shape[-1]), args.max_new_tokens,
                    getattr(target.text_config, "max_position_embeddings", None))
    drafter = None if args.drafter == "none" else load_drafter(args.drafter, target,
                                                               max_new_tokens=args.max_new_tokens)
    tree = _tree_of(args, drafter)
    draft_len = (tree.draft_len if tree is not None
                 else args.draft_len or getattr(drafter, "default_draft_len", None) or 5)
    generator = torch.Generator(device=target.device).manual_seed(args.seed)
    result = generate(target, inputs, drafter, shape=tree or draft_len,
                      max_new_tokens=args.max_new_tokens, sampling=sampling, generator=generator)
    tokens = result.tokens.tolist()
    text = target.tokenizer.decode(tokens, skip_special_tokens=True) if target.tokenizer else ""
    if not args.json:
        sys.stdout.write(text + "\n")
    stats = result.stats
    return {
        "text": text, "tokens": tokens, "tau": round(stats.tau, 4),
        "target_forwards": stats.target_forwards, "tokens_per_s": round(stats.tokens_per_s, 2),
        "new_tokens": stats.new_tokens, "drafter": args.drafter, "draft_len": draft_len,
        "tree": tree.label if tree is not None and not tree.is_chain else "",
        "accept_rates": stats.accept_rates(draft_len) if drafter is not None else [],
        "target": target.describe(), "device": str(target.device), "steps": steps,
        "compile_s": {k: round(v, 2) for k, v in (target.static.warmup_s
                                                   if target.static else {}).items()},
        "dtype": str(target.dtype).removeprefix("torch."),
    }


def _run_file(args: argparse.Namespace, target: Any, sampling: Any, steps: str) -> dict[str, Any]:
    """--prompts: every request, --batch-size at a time (`nas.stages.batch_generate`)."""
    import torch
    from dreams_nas.nas.stages.batch_generate import Decoding, generate_file
    from dreams_nas.supernet.decoding.batch_dream import BatchDreamDrafter
    from dreams_nas.supernet.decoding.registry import load_drafter

    drafter = one = None
    if args.drafter != "none":
        one = load_drafter(args.drafter, target, max_new_tokens=args.max_new_tokens)
        drafter = BatchDreamDrafter(one.draft, one.spec)
    tree = _tree_of(args, one)
    draft_len = (tree.draft_len if tree is not None
                 else args.draft_len or getattr(drafter, "default_draft_len", None) or 5)
    generator = torch.Generator(device=target.device).manual_seed(args.seed)
    out = sys.stdout if args.out == "-" else Path(args.out).expanduser().open(
        "w", encoding="utf-8")
    try:
        how = Decoding(args.batch_size, tree or draft_len, args.max_new_tokens, sampling,
                       generator)
        summary = generate_file(target, Path(args.prompts).expanduser(), drafter, how, out,
                                check_positions)
    finally:
        if out is not sys.stdout:
            out.close()
    return {**summary, "drafter": args.drafter, "draft_len": draft_len if drafter else 0,
            "tree": tree.label if tree is not None and drafter is not None else "",
            "out": args.out, "target": target.describe(), "device": str(target.device),
            "steps": steps, "dtype": str(target.dtype).removeprefix("torch.")}


def _tree_of(args: argparse.Namespace, drafter: Any) -> Any:
    """--tree, else the spec folder's tree unless --draft-len asks for a chain; None: a chain."""
    from dreams_nas.supernet.core.tree import TokenTree

    if args.tree is not None:
        return TokenTree.parse(args.tree)
    if args.draft_len is None:
        return getattr(drafter, "default_tree", None)
    return None
