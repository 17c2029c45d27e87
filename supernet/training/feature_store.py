"""The feature store: the target's training features, computed once, on disk, read per sample.

Self-distillation trains on what the frozen target computes for every training sequence (the
hidden states at the inject and distillation layers, the last hidden state: `features`). Kept
in memory they grow with the prompts (about 60 MB a prompt for LLaVA-1.5-7B in float32), so they
are written here instead, as the target computes them, into sharded safetensors files of a
run's `supernet/features/`:

```
supernet/features/
  index.json              key, dtype, layers, the complete shards (SCHEMAS.md)
  shard-00000.safetensors samples 0 .. samples_per_shard - 1, tensors "<row>.<name>"
  shard-00001.safetensors ...
```

Tensors keep the dtype the target produced them in (bf16 stays bf16); a read upcasts the
features to float32 as `features.collect_sample` does, so training computes exactly what it
computes from samples held in memory. A shard is written whole to a temporary sibling and
renamed, then listed in the index; `index.json`'s `key` hashes everything the features depend
on (target, dtype, prompts, answers, layers, shard size), so a store of other inputs is never
read: it is deleted and rebuilt, while a rerun with the same key (after a kill) computes only
the shards the index does not list. Reading is lazy: `FeatureStore` is a
`Sequence[TargetSample]` whose items are read (memory-mapped, `safetensors.safe_open`) from
their own shard when indexed; slices are views.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch
from dreams_nas.supernet.core.digests import files_sha256
from dreams_nas.supernet.core.dist import World, current
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json, locked, read_json
from dreams_nas.supernet.core.progress import progress
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.features import TargetSample, sample_from_record, target_record
from torch import Tensor

log = logging.getLogger("dreams_nas")

INDEX = "index.json"
STORE_SCHEMA_VERSION = 1  # index.json `schema_version`
# Samples per shard: the writer holds one shard's tensors (in the target's dtype) until it is
# written -- about 250 MB for LLaVA-1.5-7B in bf16, 1.2 GB for LLaVA-NeXT's 2880 visual tokens.
DEFAULT_SHARD_SAMPLES = 8
MAX_OPEN_SHARDS = 8  # memory-mapped shards a reader keeps open (least recently used closed)
_STATIC = ("input_ids", "prompt_len", "visual_mask", "visual_scores", "last")


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}.safetensors"


def store_key(target: TargetAdapter, examples: Sequence[Any], answers: Sequence[Tensor],
              memory_layers: Sequence[int], distill_layers: Sequence[int],
              samples_per_shard: int) -> str:
    """16 hex digits of a sha256 over everything the stored features depend on: the target
    (id or path, architecture, dtype), each example (id, image content, prompt) and its answer
    ids, the layers kept and the shard size."""
    described = target.describe()
    images = files_sha256(ex.image_path for ex in examples)
    digest = hashlib.sha256(json.dumps({
        "schema_version": STORE_SCHEMA_VERSION,
        "target": str(target.path or target.target_id),
        "architecture": described.get("architecture_hash"), "dtype": str(target.dtype),
        "examples": [[str(ex.id), image, ex.prompt]
                     for ex, image in zip(examples, images, strict=True)],
        "memory_layers": [int(i) for i in memory_layers],
        "distill_layers": [int(i) for i in distill_layers],
        "samples_per_shard": int(samples_per_shard),
    }).encode())
    for answer in answers:
        digest.update(answer.to(torch.long).numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:16]


class _Shards:
    """The open (memory-mapped) shard files of one store, at most `max_open` at a time."""

    def __init__(self, directory: Path, max_open: int) -> None:
        self.directory = directory
        self.max_open = max(1, int(max_open))
        self.handles: OrderedDict[int, Any] = OrderedDict()

    def tensor(self, shard: int, name: str) -> Tensor:
        from safetensors import safe_open

        handle = self.handles.get(shard)
        if handle is None:
            path = self.directory / shard_name(shard)
            if not path.is_file():
                raise InputError(f"the feature store shard {path} is missing; delete "
                                 f"{self.directory} and rerun `dreams-nas train` to rebuild it")
            handle = safe_open(str(path), framework="pt", device="cpu")
            self.handles[shard] = handle
            while len(self.handles) > self.max_open:
                self.handles.popitem(last=False)
        else:
            self.handles.move_to_end(shard)
        return handle.get_tensor(name)

    def close(self) -> None:
        self.handles.clear()


class FeatureStore(Sequence[TargetSample]):
    """The target samples of a complete store, read from disk on access (see the module).

    `store[i]` reads sample i from its shard (features upcast to float32); `store[a:b]` is a
    view over the same open shards; `input_ids(i)` reads sample i's ids alone."""

    def __init__(self, directory: str | Path, index: Mapping[str, Any],
                 rows: range | None = None, shards: _Shards | None = None,
                 max_open: int = MAX_OPEN_SHARDS) -> None:
        self.directory = Path(directory)
        self.index = dict(index)
        self.per_shard = int(self.index["samples_per_shard"])
        self.memory_layers = tuple(int(i) for i in self.index["memory_layers"])
        self.distill_layers = tuple(int(i) for i in self.index["distill_layers"])
        self.rows = range(int(self.index["n_samples"])) if rows is None else rows
        self._shards = shards or _Shards(self.directory, max_open)

    @classmethod
    def open(cls, directory: str | Path, key: str | None = None,
             max_open: int = MAX_OPEN_SHARDS) -> FeatureStore:
        """The complete store in `directory` (with `key`, when given)."""
        directory = Path(directory)
        index = _read_index(directory)
        if index is None or not index.get("complete"):
            raise InputError(f"{directory} holds no complete feature store; run "
                             "`dreams-nas train` to compute it")
        if key is not None and index.get("key") != key:
            raise InputError(f"the feature store in {directory} belongs to other inputs "
                             f"(key {index.get('key')}, not {key}); delete it to rebuild it")
        return cls(directory, index, max_open=max_open)

    # --- Sequence -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, item: int) -> TargetSample: ...

    @overload
    def __getitem__(self, item: slice) -> FeatureStore: ...

    def __getitem__(self, item: int | slice) -> TargetSample | FeatureStore:
        if isinstance(item, slice):
            return FeatureStore(self.directory, self.index, self.rows[item], self._shards)
        row = self.rows[item]  # IndexError past the end (ends iteration)
        names = [*_STATIC, *(f"memory.{i}" for i in self.memory_layers),
                 *(f"distill.{i}" for i in self.distill_layers)]
        record = {name: self._read(row, name) for name in names}
        return sample_from_record(record, self.memory_layers, self.distill_layers)

    def __iter__(self) -> Iterator[TargetSample]:
        for i in range(len(self)):
            yield self[i]

    def input_ids(self, index: int) -> Tensor:
        """(seq,) int64: sample `index`'s prompt + answer ids, read without its features."""
        return self._read(self.rows[index], "input_ids")

    def _read(self, row: int, name: str) -> Tensor:
        return self._shards.tensor(row // self.per_shard, f"{row}.{name}")

    # --- bookkeeping ----------------------------------------------------------------
    @property
    def open_shards(self) -> tuple[int, ...]:
        """The shards currently open (memory-mapped), least recently used first."""
        return tuple(self._shards.handles)

    @property
    def num_bytes(self) -> int:
        return sum(int(entry["bytes"]) for entry in self.index["shards"])

    def close(self) -> None:
        """Drop the open shards (a later read opens its shard again)."""
        self._shards.close()

    def __getstate__(self) -> dict[str, Any]:  # picklable: the open files are not carried
        state = dict(self.__dict__)
        state["_shards"] = _Shards(self._shards.directory, self._shards.max_open)
        return state

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.directory)!r}, samples={len(self)}, "
                f"shards={len(self.index['shards'])})")


def _read_index(directory: Path) -> dict[str, Any] | None:
    path = directory / INDEX
    if not path.is_file():
        return None
    try:
        data = read_json(path)
    except InputError:  # unreadable: the store is rebuilt
        return None
    if not isinstance(data, dict) or data.get("schema_version") != STORE_SCHEMA_VERSION:
        return None
    return data


def _clear(directory: Path) -> None:
    """Delete every shard and temporary file of the store in `directory` (and its index)."""
    for path in [*directory.glob("shard-*.safetensors"), *directory.glob(".*.tmp")]:
        path.unlink(missing_ok=True)
    (directory / INDEX).unlink(missing_ok=True)


@dataclass(frozen=True)
class StoreLayout:
    """What a store holds and how (its index records each): `key` (`store_key`: the inputs
    the features depend on), the target layers whose hidden states are kept as the
    cross-attention's memory and as distillation targets, and the prompts per shard."""

    key: str
    memory_layers: Sequence[int]
    distill_layers: Sequence[int]
    samples_per_shard: int = DEFAULT_SHARD_SAMPLES


def build_store(directory: str | Path, target: TargetAdapter,
                prompts: Sequence[Mapping[str, Tensor]], answers: Sequence[Tensor],
                layout: StoreLayout, *, show_progress: bool | None = None,
                world: World | None = None) -> FeatureStore:
    """The feature store of `prompts` + `answers` in `directory`: reused when its index has
    `layout.key` and is complete, completed when its index has that key (the shards it lists
    are kept), else built afresh. `prompts` are read one at a time (a lazy sequence builds each
    on access); each shard's samples are held until the shard is written.

    world: the processes building it together (default `dist.current()`): rank r computes the
    shards k with k % size == r and lists each in the index (under its lock) as it is written;
    rank 0 starts the index and marks it complete once every rank is done. The shards are those
    one process writes, whatever the number of ranks (and a store built by N ranks resumes
    under any other number). One process holds the index's lock throughout: a second build of
    the same folder waits, then reuses it."""
    directory = Path(directory)
    world = world or current()
    n = len(prompts)
    if len(answers) != n:
        raise ValueError(f"{n} prompts but {len(answers)} answers")
    per_shard = int(layout.samples_per_shard)
    if per_shard < 1:
        raise InputError(f"samples_per_shard={per_shard} must be at least 1")
    directory.mkdir(parents=True, exist_ok=True)
    fresh = {"schema_version": STORE_SCHEMA_VERSION, "key": layout.key,
             "dtype": str(target.dtype).removeprefix("torch."), "n_samples": n,
             "samples_per_shard": per_shard,
             "memory_layers": [int(i) for i in layout.memory_layers],
             "distill_layers": [int(i) for i in layout.distill_layers],
             "complete": False, "shards": []}
    count = -(-n // per_shard)
    if not world.distributed:
        with locked(directory / INDEX, timeout=-1):  # one writer; a second waits, reuses
            index = _started(directory, fresh)
            done = _listed(directory, index)
            todo = [k for k in range(count) if k not in done]
            if todo or not index["complete"]:
                if done:
                    log.info("feature store in %s: %d of %d shards already computed",
                             directory, len(done), count)
                _write_shards(directory, index, todo, target, prompts, answers, show_progress,
                              lock=False)
                _mark_complete(directory, count)
            index = _read_index(directory) or index
        return _opened(FeatureStore(directory, index))
    if world.is_main:
        with locked(directory / INDEX, timeout=-1):
            _started(directory, fresh)
    world.barrier()
    with locked(directory / INDEX, timeout=-1):
        index = _read_index(directory) or fresh
    done = _listed(directory, index)
    mine = [k for k in range(count) if world.owns(k) and k not in done]
    if len(done) < count or not index["complete"]:
        if world.is_main and done:
            log.info("feature store in %s: %d of %d shards already computed", directory,
                     len(done), count)
        _write_shards(directory, index, mine, target, prompts, answers, show_progress,
                      lock=True)
    world.barrier()
    if world.is_main:
        with locked(directory / INDEX, timeout=-1):
            _mark_complete(directory, count)
    world.barrier()
    return _opened(FeatureStore(directory, _read_index(directory) or index))


def _started(directory: Path, fresh: dict[str, Any]) -> dict[str, Any]:
    """The index of `directory` when it has `fresh`'s key; else the store is cleared and
    `fresh` written as its index. Call under the index's lock."""
    index = _read_index(directory)
    if index is not None and index.get("key") == fresh["key"]:
        return index
    if any(directory.glob("shard-*.safetensors")):
        log.info("feature store in %s: built from other inputs (or unreadable); rebuilding it",
                 directory)
    _clear(directory)
    atomic_write_json(directory / INDEX, fresh)
    return dict(fresh)


def _listed(directory: Path, index: Mapping[str, Any]) -> set[int]:
    """The shards the index lists whose files exist."""
    return {int(entry["file"][len("shard-"):-len(".safetensors")]) for entry in index["shards"]
            if (directory / entry["file"]).is_file()}


def _write_shards(directory: Path, index: Mapping[str, Any], todo: Sequence[int],
                  target: TargetAdapter, prompts: Sequence[Mapping[str, Tensor]],
                  answers: Sequence[Tensor], show_progress: bool | None, lock: bool) -> None:
    """Compute and write the shards `todo`, each listed in the index as soon as it is on disk
    (`lock`: take the index's lock for it; False: the caller holds it)."""
    from dreams_nas.supernet.draft.saving import save_tensors

    for k in todo:  # a killed writer's temporary file: never listed, never read
        (directory / f".{shard_name(k)}.tmp").unlink(missing_ok=True)
    n, per_shard = int(index["n_samples"]), int(index["samples_per_shard"])
    memory, distill = index["memory_layers"], index["distill_layers"]
    bar = progress(total=sum(min(n, (k + 1) * per_shard) - k * per_shard for k in todo),
                   desc="target features", unit="prompt", disable=show_progress is False or None)
    for k in todo:
        rows = range(k * per_shard, min(n, (k + 1) * per_shard))
        tensors: dict[str, Tensor] = {}
        for row in rows:
            record = target_record(target, prompts[row], answers[row], memory, distill)
            tensors.update({f"{row}.{name}": value for name, value in record.items()})
            bar.update(1)
        final = directory / shard_name(k)
        tmp = directory / f".{final.name}.tmp"
        save_tensors(tensors, tmp, final)
        tmp.replace(final)
        del tensors
        entry = {"file": final.name, "start": rows.start, "stop": rows.stop,
                 "bytes": final.stat().st_size}
        _list_shard(directory, entry, lock)  # the shard counts from here on
    bar.close()


def _list_shard(directory: Path, entry: dict[str, Any], lock: bool) -> None:
    """Add `entry` to the index (re-read: other ranks list theirs too), shards in order."""
    def add() -> None:
        index = _read_index(directory)
        assert index is not None, "the index is written before any shard"
        shards = {e["file"]: e for e in index["shards"]}
        shards[entry["file"]] = entry
        index["shards"] = [shards[name] for name in sorted(shards)]
        atomic_write_json(directory / INDEX, index)

    if lock:
        with locked(directory / INDEX, timeout=-1):
            add()
    else:
        add()


def _mark_complete(directory: Path, count: int) -> None:
    """Mark the index complete, once it lists all `count` shards."""
    index = _read_index(directory)
    assert index is not None
    missing = sorted(set(range(count)) - _listed(directory, index))
    if missing:
        raise InputError(f"the feature store in {directory} lacks shards {missing} after "
                         "every rank finished; rerun `dreams-nas train` to compute them")
    index["complete"] = True
    atomic_write_json(directory / INDEX, index)


def _opened(store: FeatureStore) -> FeatureStore:
    log.info("feature store: %d shards, %.1f MB in %s (kept for reruns; deleting it costs the "
             "next training one target pass)", len(store.index["shards"]),
             store.num_bytes / 1e6, store.directory)
    return store
