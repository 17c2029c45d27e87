"""Progress bars for long work: on stderr, with rate and ETA, off when stderr is not a terminal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    disable: bool | None = None,
) -> Any:
    """A tqdm bar on stderr; ``disable=None`` hides it when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True,
                leave=False)
