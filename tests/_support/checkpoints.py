"""Loadable checkpoint folders of every tiny family, for tests that run the CLI on a folder.

`models.save_tiny_vlm` writes the processor with ``save_pretrained``, which the in-memory
`TinyProcessor` of Pixtral, Mistral3, SmolVLM and Qwen-VL does not have: those families'
transformers processor classes need torchvision, which is not installed here. `save_checkpoint`
writes the model and, for those families, the tokenizer, and returns the processor to serve;
`serve_processors` makes ``AutoProcessor.from_pretrained`` of such a folder return it. The CLI
then loads the model from disk as it would anywhere, with the processor the family's tests use.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from _support.models import build_tiny_vlm
from _support.processing import TinyProcessor


def save_checkpoint(family: str, folder: str | Path) -> tuple[Path, TinyProcessor | None]:
    """(folder, the processor `serve_processors` must serve for it, or None when the folder holds
    a loadable processor of its own)."""
    model, processor = build_tiny_vlm(family)
    folder = Path(folder)
    model.save_pretrained(folder)
    if isinstance(processor, TinyProcessor):
        processor.tokenizer.save_pretrained(folder)  # carries the chat template
        return folder, processor
    processor.save_pretrained(folder)
    return folder, None


def serve_processors(monkeypatch: pytest.MonkeyPatch, processors: Mapping[Path, Any]) -> None:
    """``AutoProcessor.from_pretrained(folder)`` returns ``processors[folder]`` for the folders
    in `processors` (read at call time, so folders can be added later); others load as usual."""
    from transformers import AutoProcessor

    original = AutoProcessor.from_pretrained

    def from_pretrained(source: Any, *args: Any, **kwargs: Any) -> Any:
        processor = processors.get(Path(str(source)).resolve())
        return processor if processor is not None else original(source, *args, **kwargs)

    monkeypatch.setattr(AutoProcessor, "from_pretrained", from_pretrained)
