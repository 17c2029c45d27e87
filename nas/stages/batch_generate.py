"""`dreams-nas generate --prompts FILE.jsonl --batch-size B`: many requests, B at a time.

The requests (LLaVA-style JSONL, the format `score --data` reads; image paths relative to the
file; a gpt turn, if any, is ignored) are decoded in input order, B at a time, as one batch each
(`supernet.decoding.batch_loop`): every row stops on its own, and the rows that go on form a
smaller batch. Each request's line is written, in input order, as soon as its batch ends:
``{"id", "tokens", "text", "new_tokens"}``, or ``{"id", "error"}`` for a request that failed
alone (an unreadable line or image, a prompt past the target's positions): the others of its
batch decode as if it were not there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.data.prompts import Example, load_requests
from dreams_nas.supernet.decoding.batch_loop import generate_batch
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.target.adapter import TargetAdapter

log = logging.getLogger(__name__)


def _prepare(target: TargetAdapter, item: Example | InputError, max_new_tokens: int,
             check: Callable[[int, int, int | None], None]) -> dict[str, Any]:
    """The request's model inputs, or the one-line error that fails it alone."""
    if isinstance(item, InputError):
        raise item
    inputs = target.build_inputs(item.image_path, item.prompt)
    check(int(inputs["input_ids"].shape[-1]), max_new_tokens,
          getattr(target.text_config, "max_position_embeddings", None))
    return inputs


@dataclass(frozen=True)
class Decoding:
    """How every batch decodes."""

    batch_size: int
    shape: Any  # what each cycle drafts: a chain's draft_len, or a TokenTree
    max_new_tokens: int
    sampling: SamplingConfig
    generator: torch.Generator | None = None


def generate_file(target: TargetAdapter, prompts: str | Path, drafter: Any | None,
                  how: Decoding, out: IO[str],
                  check: Callable[[int, int, int | None], None]) -> dict[str, Any]:
    """Decode every request of `prompts`, `how.batch_size` at a time, with `drafter` (a
    `BatchDreamDrafter`, None: plain), one JSON line each to `out`; `check(prompt_len,
    max_new_tokens, max_positions)` refuses a request that runs past the target's positions.
    Returns the summary (requests, failed, tokens, throughput, tau)."""
    batch_size, max_new_tokens = how.batch_size, how.max_new_tokens
    if batch_size < 1:
        raise InputError(f"--batch-size {batch_size} must be >= 1")
    items = load_requests(prompts)
    failed = new_tokens = 0
    seconds = kept = cycles = 0.0
    bar = progress(total=len(items), desc="generate", unit="request")
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        lines: list[dict[str, Any]] = []
        ready: list[tuple[int, dict[str, Any]]] = []
        for i, item in enumerate(chunk):
            name = item.id if isinstance(item, Example) else f"line {start + i + 1}"
            lines.append({"id": name})
            try:
                ready.append((i, _prepare(target, item, max_new_tokens, check)))
            except InputError as exc:
                lines[i]["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                failed += 1
        if ready:
            result = generate_batch(target, [inputs for _, inputs in ready], drafter,
                                    shape=how.shape, max_new_tokens=max_new_tokens,
                                    sampling=how.sampling, generator=how.generator)
            for (i, _), tokens in zip(ready, result.tokens, strict=True):
                ids = tokens.tolist()
                text = target.tokenizer.decode(ids, skip_special_tokens=True) \
                    if target.tokenizer is not None else ""
                lines[i].update(tokens=ids, text=text, new_tokens=len(ids))
            stats = result.stats
            new_tokens += stats.new_tokens
            seconds += stats.total_s
            kept += sum(stats.cycle_lengths)
            cycles += len(stats.cycle_lengths)
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        bar.update(len(chunk))
    bar.close()
    if failed:
        log.warning("warning: %d of %d requests failed (their lines say why)", failed, len(items))
    return {"requests": len(items), "failed": failed, "new_tokens": new_tokens,
            "tokens_per_s": round(new_tokens / seconds, 2) if seconds else None,
            "tau": round(kept / cycles, 4) if cycles else None, "batch_size": batch_size}
