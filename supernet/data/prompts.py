"""Image + question + answer data: LLaVA-style JSONL in and out, and the built-in synthetic set.

The format is LLaVA's instruction-tuning JSONL, one object per line::

    {"id": "...", "image": "images/x.png",
     "conversations": [{"from": "human", "value": "<image>\\nWhat is ...?"},
                       {"from": "gpt", "value": "The answer ..."}]}

A relative ``image`` path is resolved against the JSONL file's folder. The first human turn is
the prompt (its ``<image>`` marker removed) and the gpt turn right after it is the answer.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import (
    atomic_write_bytes,
    atomic_write_json,
    default_cache_dir,
    locked,
    read_json,
)
from dreams_nas.supernet.data.synth import SPLITS, TASKS, TRAIN_TASKS, make_sample

IMAGE_MARKER = "<image>"
SYNTH_VERSION = "synth-v1"
_COMPLETE = "complete.json"


@dataclass(frozen=True)
class Example:
    """One training or evaluation example."""

    id: str
    image_path: Path
    prompt: str  # the user's question, without the <image> marker
    answer: str


def strip_image_marker(text: str) -> str:
    """``"<image>\\nWhat is it?"`` -> ``"What is it?"`` (the marker may sit anywhere)."""
    return " ".join(text.replace(IMAGE_MARKER, " ").split())


def load_llava_jsonl(path: str | Path, check_images: bool = True) -> list[Example]:
    """Read a LLaVA-style JSONL file; a malformed line raises one error naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise MissingArtefactError(
            f"data file {path} does not exist; pass a LLaVA-style .jsonl file or `builtin`")
    examples: list[Example] = []
    seen: set[str] = set()
    for lineno, line in _text_lines(path):
        if not line.strip():
            continue
        example = _parse_line(path, lineno, line, check_images)
        if example.id in seen:
            raise InputError(f"{path}:{lineno}: id {example.id!r} appears twice; ids must be "
                             "unique")
        seen.add(example.id)
        examples.append(example)
    if not examples:
        raise InputError(f"{path} holds no examples; it needs one JSON object per line")
    return examples


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 file; bytes that are not UTF-8 raise one
    error naming the file, the line and the byte offset (a decoder's error names neither)."""
    offset = 0
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{path}:{lineno}: byte {offset + exc.start} (0x{raw[exc.start]:02x}) is not "
                    "UTF-8; save the file as UTF-8 (e.g. `iconv -t UTF-8`)") from None
            yield lineno, text
            offset += len(raw)


def load_requests(path: str | Path) -> list[Example | InputError]:
    """The requests of a LLaVA-style JSONL file for `generate`, in order: each line's example
    (a gpt turn, if any, is ignored: its `answer` is ""), or the one-line error that line
    raised (unreadable JSON, a missing key, a repeated id), so one bad line fails alone."""
    path = Path(path)
    if not path.is_file():
        raise MissingArtefactError(f"prompts file {path} does not exist; pass a LLaVA-style "
                                   ".jsonl file (one request per line)")
    out: list[Example | InputError] = []
    seen: set[str] = set()
    for lineno, line in _text_lines(path):
        if not line.strip():
            continue
        try:
            example = _parse_line(path, lineno, line, False, need_answer=False)
            if example.id in seen:
                raise InputError(f"{path}:{lineno}: id {example.id!r} appears twice; ids must "
                                 "be unique")
            seen.add(example.id)
            out.append(example)
        except InputError as exc:
            out.append(exc)
    if not out:
        raise InputError(f"{path} holds no requests; it needs one JSON object per line")
    return out


def _parse_line(path: Path, lineno: int, line: str, check_images: bool,
                need_answer: bool = True) -> Example:
    where = f"{path}:{lineno}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON "
                         "object") from None
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with id, image and conversations, "
                         f"got {type(record).__name__}")
    missing = [key for key in ("id", "image", "conversations") if key not in record]
    if missing:
        raise InputError(f"{where}: missing key(s) {missing}; each line needs id, image and "
                         "conversations")
    turns = record["conversations"]
    if not isinstance(turns, list) or not all(
            isinstance(t, dict) and isinstance(t.get("from"), str)
            and isinstance(t.get("value"), str) for t in turns):
        raise InputError(f"{where}: conversations must be a list of "
                         '{"from": ..., "value": "..."} objects')
    human = next((i for i, t in enumerate(turns) if t["from"] == "human"), None)
    answered = (human is not None and human + 1 < len(turns)
                and turns[human + 1]["from"] == "gpt")
    if human is None or (need_answer and not answered):
        raise InputError(f"{where}: conversations need a human turn followed by a gpt turn")
    prompt = strip_image_marker(turns[human]["value"])
    answer = turns[human + 1]["value"].strip() if answered and need_answer else ""
    if not prompt:
        raise InputError(f"{where}: the human question must not be empty")
    if need_answer and not answer:
        raise InputError(f"{where}: the human question and the gpt answer must not be empty")
    image = Path(str(record["image"]))
    image_path = image if image.is_absolute() else path.parent / image
    if check_images and not image_path.is_file():
        raise MissingArtefactError(f"{where}: image file {image_path} does not exist; image "
                                   "paths are relative to the JSONL file's folder")
    return Example(id=str(record["id"]), image_path=image_path, prompt=prompt, answer=answer)


def llava_record(example_id: str, image: str, prompt: str, answer: str) -> dict:
    return {"id": example_id, "image": image, "conversations": [
        {"from": "human", "value": f"{IMAGE_MARKER}\n{prompt}"},
        {"from": "gpt", "value": answer}]}


def write_synthetic(out_dir: str | Path, n: int, split: str, seed: int = 0,
                    tasks: Sequence[str] = TASKS, progress: bool = False) -> Path:
    """Render `n` samples of `split` into ``out_dir/<split>.jsonl`` + ``out_dir/images/*.png``.

    Byte-identical output for the same arguments (PNG without metadata, sorted JSON keys).
    Returns the JSONL path.
    """
    from dreams_nas.supernet.core.progress import progress as progress_bar

    if split not in SPLITS:
        raise InputError(f"--split {split!r} is not one of {list(SPLITS)}; pick train or eval")
    if n < 1:
        raise InputError(f"--n {n} must be at least 1")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise InputError(f"unknown task(s) {unknown}; pick from {list(TASKS)}")
    if not tasks:
        raise InputError(f"no task given; name one or more of {list(TASKS)}")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for index in progress_bar(range(n), desc=f"rendering {split}", unit="image",
                              disable=None if progress else True):
        sample = make_sample(split, seed, index, tuple(tasks))
        rel = f"images/{sample.id}.png"
        buffer = _png_bytes(sample.image)
        target = out / rel
        if not (target.is_file() and target.read_bytes() == buffer):
            atomic_write_bytes(target, buffer)
        record = llava_record(sample.id, rel, sample.prompt, sample.answer)
        lines.append(json.dumps(record, sort_keys=True, ensure_ascii=True))
    jsonl = out / f"{split}.jsonl"
    atomic_write_bytes(jsonl, ("\n".join(lines) + "\n").encode("utf-8"))
    return jsonl


def _png_bytes(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


def split_tasks(split: str) -> tuple[str, ...]:
    """The task mix of the built-in `split`: `TRAIN_TASKS` for train, each task once for eval."""
    return TRAIN_TASKS if split == "train" else TASKS


def builtin_dataset(split: str, n: int, seed: int = 0,
                    cache_dir: str | Path | None = None) -> list[Example]:
    """The built-in synthetic set (`split_tasks(split)`): rendered once into the cache, then
    loaded from it."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    tasks = split_tasks(split)
    folder = root / "synth" / f"{SYNTH_VERSION}-{split}{_mix_tag(tasks)}-n{n}-s{seed}"
    jsonl = folder / f"{split}.jsonl"
    if not _synth_complete(folder, n):
        folder.parent.mkdir(parents=True, exist_ok=True)
        with locked(folder.parent / f".{folder.name}"):
            if not _synth_complete(folder, n):  # another process may have written it meanwhile
                _render_into(folder, n, split, seed, tasks)
    return load_llava_jsonl(jsonl)


def _mix_tag(tasks: Sequence[str]) -> str:
    """"" for each task once (the cache folders rendered before mixes), else e.g.
    "-scene1-count1-ocr3-chart1-math1"."""
    if tuple(tasks) == TASKS:
        return ""
    return "".join(f"-{task}{list(tasks).count(task)}" for task in TASKS)


def _synth_complete(folder: Path, n: int) -> bool:
    marker = folder / _COMPLETE
    try:
        return marker.is_file() and read_json(marker).get("n") == n
    except InputError:
        return False


def _render_into(folder: Path, n: int, split: str, seed: int, tasks: Sequence[str]) -> None:
    """Render into a temporary sibling, mark it complete, then swap it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        write_synthetic(tmp, n, split, seed, tasks)
        atomic_write_json(tmp / _COMPLETE, {"version": SYNTH_VERSION, "split": split, "n": n,
                                            "seed": seed, "tasks": list(tasks)})
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_examples(data: str, split: str, n: int | None, default_n: int, seed: int,
                  option: str) -> list[Example]:
    """`data` = "builtin" (the synthetic `split`, `n or default_n` samples) or a LLaVA-style
    JSONL (its first `n` examples, all when `n` is None); `option` names the CLI flag of `n`."""
    if n is not None and n < 1:
        raise InputError(f"{option} {n} must be at least 1")
    if data == "builtin":
        return builtin_dataset(split, n or default_n, seed=seed)
    _check_data_name(data)
    examples = load_llava_jsonl(data)
    return examples[:n] if n else examples


def check_data(data: str) -> None:
    """Read and validate `--data` (every line, every image path) without rendering or loading
    anything else: commands call it first, so a bad file fails in a second, not after the
    target has loaded. The built-in set needs no check."""
    if data == "builtin":
        return
    _check_data_name(data)
    load_llava_jsonl(data)


def _check_data_name(data: str) -> None:
    if not data.endswith(".jsonl"):
        raise InputError(f"--data {data!r} is neither builtin nor a .jsonl file; pass one of those")
