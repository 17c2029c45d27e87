"""Deterministic synthetic image + question + answer tasks for the built-in target.

Every image is a ``GRID x GRID`` board of ``CELL``-pixel cells (48 x 48 pixels) and every object,
glyph or bar segment fills whole cells, so a ViT patch embedding with patch size ``CELL`` sees one
object per patch: a tiny vision tower trained from scratch in minutes can tell them apart, and the
language model learns the rest. Five task families mirror the benchmarks of the DREAM-S paper:

* ``scene``  - objects with colour, shape, size and position (SEED / MMT-like);
* ``count``  - how many shapes there are (counting);
* ``ocr``    - read a code written in a fixed bitmap font (OCR-like);
* ``chart``  - read bar values off a bar chart with coloured value labels, every bar or the
  one at a given place (ChartQA-like);
* ``math``   - solve a small sum or difference shown in the image (MathVista-like).

Answers are full sentences of about 10-60 words whose content depends on the image. A sample is a
pure function of its integer seed; the train split uses even seeds and the eval split odd ones,
so the two never share a seed. Rendering uses integer pixel coordinates only (no anti-aliasing,
no fonts from the system), so the PNGs are byte-identical for the same seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dreams_nas.supernet.core.errors import InputError
from PIL import Image, ImageDraw

CELL = 8  # pixels per cell = the vision tower's patch size
GRID = 6  # cells per side
IMAGE_SIZE = CELL * GRID  # 48
SPLITS = ("train", "eval")
TASKS = ("scene", "count", "ocr", "chart", "math")
# the built-in *training* split draws OCR three times in every seven prompts (the evaluation
# split and the built-in target's own training: each task a fifth). Reading the image's characters
# is the skill a one-layer draft wins or misses by chance when OCR is a fifth of its prompts,
# so trainings that differ only in their seed end apart (BENCHMARKS.md, 'Supernet
# acceptance over seeds'); tasks are drawn round-robin over this tuple
TRAIN_TASKS = ("scene", "count", "ocr", "chart", "math", "ocr", "ocr")
BACKGROUND = (20, 20, 28)

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 230),
    "yellow": (235, 220, 40),
    "purple": (150, 60, 200),
    "orange": (245, 140, 20),
}
SHAPES = ("square", "circle", "triangle", "diamond")
SIZES = ("small", "large")
# 3 x 3 regions of 2 x 2 cells each, row-major; the phrase that names each region.
REGIONS = ("at the top left", "at the top", "at the top right", "on the left", "in the center",
           "on the right", "at the bottom left", "at the bottom", "at the bottom right")
SCENE_REGIONS = (3, 4, 5)  # the regions scene objects are drawn in (the middle row)
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
CODE_CHARS = "0123456789ABCDEF"

# A 5 x 7 bitmap font (one string of 5 bits per row), drawn at x = 1..5, y = 0..6 of a cell.
FONT: dict[str, tuple[str, ...]] = {
    "0": ("01110", "10001", "10011", "10101", "11001", "10001", "01110"),
    "1": ("00100", "01100", "00100", "00100", "00100", "00100", "01110"),
    "2": ("01110", "10001", "00001", "00010", "00100", "01000", "11111"),
    "3": ("11111", "00010", "00100", "00010", "00001", "10001", "01110"),
    "4": ("00010", "00110", "01010", "10010", "11111", "00010", "00010"),
    "5": ("11111", "10000", "11110", "00001", "00001", "10001", "01110"),
    "6": ("00110", "01000", "10000", "11110", "10001", "10001", "01110"),
    "7": ("11111", "00001", "00010", "00100", "01000", "01000", "01000"),
    "8": ("01110", "10001", "10001", "01110", "10001", "10001", "01110"),
    "9": ("01110", "10001", "10001", "01111", "00001", "00010", "01100"),
    "A": ("01110", "10001", "10001", "11111", "10001", "10001", "10001"),
    "B": ("11110", "10001", "10001", "11110", "10001", "10001", "11110"),
    "C": ("01110", "10001", "10000", "10000", "10000", "10001", "01110"),
    "D": ("11100", "10010", "10001", "10001", "10001", "10010", "11100"),
    "E": ("11111", "10000", "10000", "11110", "10000", "10000", "11111"),
    "F": ("11111", "10000", "10000", "11110", "10000", "10000", "10000"),
    "+": ("00000", "00100", "00100", "11111", "00100", "00100", "00000"),
    "-": ("00000", "00000", "00000", "11111", "00000", "00000", "00000"),
}
INK = (245, 245, 245)
TEXT_ROW = 2  # OCR codes and math problems are written on this row, left-aligned

_PROMPTS: dict[str, tuple[str, ...]] = {
    "scene": ("Describe the image.", "What objects are in the picture?",
              "Describe the objects you see and where they are."),
    "count": ("How many shapes are in the image?", "Count the shapes.",
              "How many shapes can you see?"),
    "ocr": ("What does the text in the image say?", "Read the code in the image.",
            "What is written in the picture?"),
    "chart": ("Read the values of the bars in the chart.", "Describe the bar chart.",
              "What is the value of the {ordinal} bar?",
              "How tall is the {ordinal} bar from the left?"),
    "math": ("Solve the problem shown in the image.", "What is the result of the expression?",
             "Compute the answer to the problem in the picture."),
}


@dataclass(frozen=True)
class SynthSample:
    """One rendered example: a 48 x 48 RGB image, the user's question and the reference answer."""

    id: str
    task: str
    image: Image.Image
    prompt: str
    answer: str


def sample_seed(split: str, seed: int, index: int) -> int:
    """The per-sample seed: even for train, odd for eval, so the splits never share one."""
    if split not in SPLITS:
        raise InputError(f"split {split!r} is not one of {list(SPLITS)}; pick train or eval")
    if index < 0 or seed < 0:
        raise InputError(f"seed={seed} and index={index} must be >= 0")
    return 2 * (seed * 10_000_019 + index) + (0 if split == "train" else 1)


def make_sample(split: str, seed: int, index: int, tasks: tuple[str, ...] = TASKS) -> SynthSample:
    """Render sample `index` of `split` for dataset seed `seed` (a pure function of its
    arguments); its task is `tasks[index % len(tasks)]` (a task named k times is drawn k times
    as often)."""
    rng = random.Random(sample_seed(split, seed, index))
    task = tasks[index % len(tasks)]
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    draw = ImageDraw.Draw(image)
    prompt, answer = _RENDERERS[task](rng, draw)
    return SynthSample(id=f"synth-{split}-s{seed}-{index:06d}", task=task, image=image,
                       prompt=prompt, answer=answer)


def vocabulary_texts() -> list[str]:
    """Texts holding every word and punctuation mark the generator can emit.

    The word-level tokenizer's vocabulary is built from these (a test checks that no sample of
    any task tokenizes to an unknown token).
    """
    texts = [p.replace("{color}", c).replace("{ordinal}", o) for ps in _PROMPTS.values()
             for p in ps for c in COLORS for o in ORDINALS]
    texts += list(REGIONS) + list(NUMBER_WORDS) + list(COLORS) + list(SHAPES) + list(SIZES)
    texts += [str(v) for v in range(0, 19)] + list(CODE_CHARS)
    texts += [
        "The image shows object objects. There is a and",
        "Counting the shapes in the image gives, so there is are shape.",
        "The text in the image reads, which is characters long.",
        "The chart has bars. From left to right, the bar is.",
        "The bar from the left is the bar, and its value is.", *ORDINALS,
        "The image shows plus minus, and equals, so the answer is.",
    ]
    return texts


# --- drawing --------------------------------------------------------------------------------------

def _cell_box(row: int, col: int) -> tuple[int, int, int, int]:
    x, y = col * CELL, row * CELL
    return x, y, x + CELL - 1, y + CELL - 1


def _draw_shape(draw: ImageDraw.ImageDraw, row: int, col: int, shape: str, size: str,
                color: tuple[int, int, int]) -> None:
    x0, y0, _, _ = _cell_box(row, col)
    lo, hi = (0, 7) if size == "large" else (2, 5)
    a, b = x0 + lo, x0 + hi
    c, d = y0 + lo, y0 + hi
    if shape == "square":
        draw.rectangle((a, c, b, d), fill=color)
    elif shape == "circle":
        draw.ellipse((a, c, b, d), fill=color)
    elif shape == "triangle":
        draw.polygon([((a + b) // 2, c), (a, d), (b, d)], fill=color)
    elif shape == "diamond":
        mx, my = (a + b) // 2, (c + d) // 2
        draw.polygon([(mx, c), (b, my), (mx, d), (a, my)], fill=color)
    else:  # pragma: no cover - internal invariant
        raise AssertionError(shape)


def _draw_glyph(draw: ImageDraw.ImageDraw, row: int, col: int, char: str,
                ink: tuple[int, int, int] = INK) -> None:
    x0, y0, _, _ = _cell_box(row, col)
    for dy, bits in enumerate(FONT[char]):
        for dx, bit in enumerate(bits):
            if bit == "1":
                draw.point((x0 + 1 + dx, y0 + dy), fill=ink)


def _join(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# --- the five tasks -------------------------------------------------------------------------------

def _scene(rng: random.Random, draw: ImageDraw.ImageDraw) -> tuple[str, str]:
    # 2-3 objects on the middle row (left / center / right), listed from left to right.
    n = rng.randint(2, 3)
    regions = sorted(rng.sample(SCENE_REGIONS, n))
    parts = []
    for region in regions:
        color = rng.choice(list(COLORS))
        shape = rng.choice(SHAPES)
        size = rng.choice(SIZES)
        _draw_shape(draw, (region // 3) * 2, (region % 3) * 2, shape, size, COLORS[color])
        parts.append(f"a {size} {color} {shape} {REGIONS[region]}")
    prompt = rng.choice(_PROMPTS["scene"])
    noun = "object" if n == 1 else "objects"
    return prompt, f"The image shows {NUMBER_WORDS[n]} {noun}. There is {_join(parts)}."


def _count(rng: random.Random, draw: ImageDraw.ImageDraw) -> tuple[str, str]:
    n = rng.randint(1, 6)
    for cell in rng.sample(range(GRID * GRID), n):
        color = rng.choice(list(COLORS))
        _draw_shape(draw, cell // GRID, cell % GRID, rng.choice(SHAPES), "large", COLORS[color])
    prompt = rng.choice(_PROMPTS["count"])
    word = NUMBER_WORDS[n]
    noun = "shape" if n == 1 else "shapes"
    verb = "is" if n == 1 else "are"
    return prompt, (f"Counting the shapes in the image gives {word}, "
                    f"so there {verb} {word} {noun}.")


def _ocr(rng: random.Random, draw: ImageDraw.ImageDraw) -> tuple[str, str]:
    length = rng.randint(3, GRID)
    code = [rng.choice(CODE_CHARS) for _ in range(length)]
    row = TEXT_ROW
    for col, char in enumerate(code):
        _draw_glyph(draw, row, col, char)
    prompt = rng.choice(_PROMPTS["ocr"])
    return prompt, (f"The text in the image reads {' '.join(code)}, which is "
                    f"{NUMBER_WORDS[length]} characters long.")


def _chart(rng: random.Random, draw: ImageDraw.ImageDraw) -> tuple[str, str]:
    n = rng.randint(3, 4)
    colors = rng.sample(list(COLORS), n)
    values = [rng.randint(1, GRID - 1) for _ in range(n)]
    for col, (color, value) in enumerate(zip(colors, values, strict=True)):
        top = GRID - value  # >= 1: row 0 holds the value labels
        x0, y0, _, _ = _cell_box(top, col)
        draw.rectangle((x0 + 1, y0, x0 + CELL - 2, GRID * CELL - 1), fill=COLORS[color])
        draw.line((x0 + 1, y0, x0 + CELL - 2, y0), fill=INK)  # the bar's cap marks its top
        # The value label above each bar, in the bar's colour (as charts often label series).
        _draw_glyph(draw, 0, col, str(value), COLORS[color])
    prompt = rng.choice(_PROMPTS["chart"])
    parts = [f"the {c} bar is {v}" for c, v in zip(colors, values, strict=True)]
    if "{ordinal}" in prompt:
        # One bar, asked by its place: name it, then read its label.
        i = rng.randrange(n)
        return (prompt.format(ordinal=ORDINALS[i]),
                f"The {ORDINALS[i]} bar from the left is the {colors[i]} bar, and its value is "
                f"{values[i]}.")
    return prompt, f"The chart has {NUMBER_WORDS[n]} bars. From left to right, {_join(parts)}."


def _math(rng: random.Random, draw: ImageDraw.ImageDraw) -> tuple[str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    row = TEXT_ROW
    for col, char in enumerate((str(a), op, str(b))):
        _draw_glyph(draw, row, col, char)
    word = "plus" if op == "+" else "minus"
    result = a + b if op == "+" else a - b
    prompt = rng.choice(_PROMPTS["math"])
    return prompt, (f"The image shows {a} {word} {b}, and {a} {word} {b} equals {result}, "
                    f"so the answer is {result}.")


_RENDERERS = {"scene": _scene, "count": _count, "ocr": _ocr, "chart": _chart, "math": _math}
