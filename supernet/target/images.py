"""Opening a user's image file: one line naming the path and the fix for anything unreadable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError


def open_image(image: Any):
    """`image` (a PIL image or the path of an image file) as RGB; a path that is missing, a
    folder, not an image, or too large to decode safely raises one InputError naming it."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    path = Path(image)
    if path.is_dir():
        raise InputError(f"image file {str(path)!r} is a folder; pass the path of a PNG/JPEG "
                         "file")
    if not path.is_file():
        raise InputError(f"image file {str(path)!r} does not exist; "
                         "pass the path of a PNG/JPEG file")
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except Image.DecompressionBombError as exc:
        raise InputError(_too_large(path, exc)) from None
    except UnidentifiedImageError:
        raise InputError(f"image file {str(path)!r} cannot be read as an image (Pillow knows "
                         "no image format in it); pass a PNG or JPEG file") from None
    except (OSError, ValueError, EOFError) as exc:
        why = " ".join(str(getattr(exc, "strerror", None) or exc or "").split())
        raise InputError(f"image file {str(path)!r} cannot be read as an image "
                         f"({type(exc).__name__}{': ' + why if why else ''}); pass an intact "
                         "PNG or JPEG file") from None


# Pillow's message: "Image size (400000000 pixels) exceeds limit of 178956970 pixels, ...".
_BOMB = re.compile(r"\((\d+) pixels\) exceeds limit of (\d+) pixels")


def _too_large(path: Path, exc: Exception) -> str:
    """The one line for an image over Pillow's decompression-bomb limit: its size and the fix."""
    found = _BOMB.search(str(exc))
    size = (f"{int(found[1]):,} pixels, over Pillow's safety limit of {int(found[2]):,}"
            if found else " ".join(str(exc).split()))
    return (f"image file {str(path)!r} is too large to decode ({size}: a decompression-bomb "
            "guard); resize it, e.g. to at most 2048 pixels a side, and pass the smaller file")
