"""The contexts a profile times, from the data the run decodes.

A draft step's cost grows with the visual tokens it may attend to and every step's with the
context; both depend on the prompts, not on the checkpoint alone. A Qwen2-VL prompt holds
1-3k visual tokens where a grey square of the vision config's `image_size` gives 64, and a
LLaVA-NeXT prompt's count depends on the image's aspect ratio. So `profile` builds the
evaluation prompts (`--data`, `--limit`) with the target's own processor -- no forward pass --
and reads off each prompt's visual tokens and length; the default context grid spans the
shortest prompt to the longest prompt plus a whole answer (`--max-new-tokens`), where every
step of the decode runs, and the draft's visual-token feature is their median.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("dreams_nas")
GRID_POINTS = 5


@dataclass(frozen=True)
class DataContexts:
    """Visual tokens and length (tokens, visual ones included) of each evaluation prompt."""

    data: str
    visual_tokens: tuple[int, ...]
    prompt_lens: tuple[int, ...]
    max_new_tokens: int

    @property
    def median_visual_tokens(self) -> int:
        return int(round(statistics.median(self.visual_tokens)))

    def span(self) -> tuple[int, int]:
        """(shortest prompt, longest prompt + a whole answer): where the decode's steps run."""
        return min(self.prompt_lens), max(self.prompt_lens) + self.max_new_tokens

    def grid(self, points: int = GRID_POINTS) -> list[int]:
        """`points` context lengths evenly over `span` (fewer when the span is narrower)."""
        low, high = self.span()
        if points <= 1 or high <= low:
            return [low]
        step = (high - low) / (points - 1)
        return sorted({int(round(low + i * step)) for i in range(points)})

    def to_dict(self) -> dict[str, Any]:
        def summary(values: Sequence[int]) -> dict[str, int]:
            return {"min": min(values), "median": int(round(statistics.median(values))),
                    "max": max(values)}

        return {"data": self.data, "n_prompts": len(self.prompt_lens),
                "visual_tokens": summary(self.visual_tokens),
                "prompt_len": summary(self.prompt_lens), "max_new_tokens": self.max_new_tokens,
                "span": list(self.span())}


def measure_data_contexts(adapter: Any, examples: Sequence[Any], data: str,
                          max_new_tokens: int) -> DataContexts | None:
    """Each example's prompt built by the target's processor (image first, chat template), its
    visual tokens and length; None when the target has no processor (the caller falls back to
    the config's count) or no example builds."""
    if adapter.processor is None or not examples:
        return None
    image_id = adapter.info.image_token_id
    visual, lengths = [], []
    for example in examples:
        try:
            ids = adapter.build_inputs(example.image_path, example.prompt)["input_ids"]
        except Exception as exc:  # noqa: BLE001 - the profile still runs from the config
            log.warning("cannot build evaluation prompt %s with the target's processor (%s); "
                        "the profile's contexts come from the config instead",
                        getattr(example, "id", "?"), " ".join(str(exc).split())[:200])
            return None
        visual.append(int((ids == image_id).sum()) if image_id is not None else 0)
        lengths.append(int(ids.shape[-1]))
    return DataContexts(data=data, visual_tokens=tuple(visual), prompt_lens=tuple(lengths),
                        max_new_tokens=int(max_new_tokens))
