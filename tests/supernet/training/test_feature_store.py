"""The feature store (`supernet.training.feature_store`) and the lazy prompts of training: the
stored samples are `collect_sample`'s exactly, a killed build resumes, a store of other inputs is
rebuilt, reading is per shard, and training from the store is training from the list."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _support.models import PROMPTS, build_tiny_vlm, tiny_image
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.data.prompts import Example
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training import feature_store as store_module
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.convergence import HeldOut, split_heldout
from dreams_nas.supernet.training.feature_store import (
    INDEX,
    FeatureStore,
    StoreLayout,
    build_store,
    shard_name,
    store_key,
)
from dreams_nas.supernet.training.features import TargetSample, collect_sample
from dreams_nas.supernet.training.recipe import (
    SupernetRecipe,
    build_draft,
    prepare_data,
    train_run,
)
from dreams_nas.supernet.training.selfdistill import (
    PromptInputs,
    answers_key,
    prompt_inputs,
    regenerate_answers,
)
from dreams_nas.supernet.training.tppt import TrainingSet, train_supernet

pytestmark = pytest.mark.usefixtures("one_thread")

MEMORY, DISTILL = (1, 2), (2,)
N, PER_SHARD = 7, 2  # shards of 2, 2, 2, 1


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> list[Example]:
    folder = tmp_path_factory.mktemp("images")
    out = []
    for i in range(N):
        path = folder / f"{i}.png"
        tiny_image(i).save(path)
        out.append(Example(str(i), path, PROMPTS[i % len(PROMPTS)], ""))
    return out


def _target(dtype: torch.dtype) -> TargetAdapter:
    return TargetAdapter.from_model(*build_tiny_vlm("llava", dtype=dtype))


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def setup(request, examples):
    """(target, lazy prompts, answers) of a float32 and a bfloat16 tiny LLaVA."""
    target = _target(request.param)
    prompts = prompt_inputs(target, examples)
    answers = regenerate_answers(target.model, prompts, max_new_tokens=6, show_progress=False)
    return target, prompts, answers


@pytest.fixture(scope="module")
def fp32(examples):
    target = _target(torch.float32)
    prompts = prompt_inputs(target, examples)
    answers = regenerate_answers(target.model, prompts, max_new_tokens=6, show_progress=False)
    return target, prompts, answers


def _build(directory: Path, target, prompts, answers, examples, **kw) -> FeatureStore:
    key = store_key(target, examples, answers, MEMORY, DISTILL, PER_SHARD)
    return build_store(directory, target, prompts, answers,
                       StoreLayout(key, MEMORY, DISTILL, PER_SHARD), show_progress=False, **kw)


def assert_same(a: TargetSample, b: TargetSample) -> None:
    assert a.prompt_len == b.prompt_len
    for name in ("input_ids", "visual_mask", "visual_scores", "last_hidden"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("memory_hidden", "distill_hidden"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.keys() == y.keys(), name
        for layer in x:
            assert x[layer].dtype == y[layer].dtype == torch.float32
            assert torch.equal(x[layer], y[layer]), (name, layer)


@pytest.fixture
def counted(monkeypatch):
    """The rows whose features the store computes (its calls of the target)."""
    rows: list[int] = []
    real = store_module.target_record

    def record(target, prompt, answer, memory, distill):
        rows.append(int(prompt["_row"]) if "_row" in prompt else -1)
        return real(target, {k: v for k, v in prompt.items() if k != "_row"}, answer, memory,
                    distill)

    monkeypatch.setattr(store_module, "target_record", record)
    return rows


class Numbered(PromptInputs):
    """Lazy prompts that say which row they are (and can fail at one, as a kill would)."""

    def __init__(self, target, examples, fail_at: int | None = None) -> None:
        super().__init__(target, examples)
        self.fail_at = fail_at

    def __getitem__(self, item):
        if isinstance(item, slice):
            raise NotImplementedError
        if item == self.fail_at:
            raise KeyboardInterrupt
        return {**super().__getitem__(item), "_row": torch.tensor(item)}


# --- (a) the round trip -------------------------------------------------------------------
def test_the_stored_samples_are_collect_sample_exactly(setup, examples, tmp_path):
    target, prompts, answers = setup
    store = _build(tmp_path / "features", target, prompts, answers, examples)
    assert len(store) == N
    for i in range(N):
        assert_same(store[i], collect_sample(target, prompts[i], answers[i], MEMORY, DISTILL))
    # the features are kept in the target's dtype, read back as float32
    index = json.loads((tmp_path / "features" / INDEX).read_text())
    assert index["dtype"] == str(target.dtype).removeprefix("torch.") and index["complete"]
    assert [e["file"] for e in index["shards"]] == [shard_name(k) for k in range(4)]
    assert [(e["start"], e["stop"]) for e in index["shards"]] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    from safetensors import safe_open

    with safe_open(str(tmp_path / "features" / shard_name(1)), framework="pt") as shard:
        assert shard.get_tensor("3.last").dtype == target.dtype
        assert shard.get_tensor("3.memory.1").dtype == target.dtype
        assert shard.get_tensor("3.input_ids").dtype == torch.long
        assert sorted(k.split(".", 1)[0] for k in shard.keys()) == ["2"] * 8 + ["3"] * 8
    # slices are views, the store pickles without its open files, ids read alone
    view = store[-3:]
    assert isinstance(view, FeatureStore) and len(view) == 3
    assert_same(view[0], store[4])
    again = pickle.loads(pickle.dumps(store))
    assert again.open_shards == () and torch.equal(again.input_ids(5), store[5].input_ids)
    assert sum(p.stat().st_size for p in (tmp_path / "features").glob("shard-*")) \
        == store.num_bytes


# --- (b) resume ---------------------------------------------------------------------------
def test_a_killed_build_resumes_with_the_missing_shards_only(fp32, examples, tmp_path, counted):
    target, _, answers = fp32
    fresh = _build(tmp_path / "fresh", target, Numbered(target, examples), answers, examples)
    assert sorted(counted) == list(range(N))
    counted.clear()
    folder = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):  # killed in shard 2, after shards 0 and 1
        _build(folder, target, Numbered(target, examples, fail_at=5), answers, examples)
    assert counted == [0, 1, 2, 3, 4]
    index = json.loads((folder / INDEX).read_text())
    assert not index["complete"] and [e["file"] for e in index["shards"]] == [
        shard_name(0), shard_name(1)]
    leftover = folder / f".{shard_name(2)}.tmp"
    leftover.write_bytes(b"half a shard")
    before = {k: (folder / shard_name(k)).stat().st_mtime_ns for k in (0, 1)}
    counted.clear()
    resumed = _build(folder, target, Numbered(target, examples), answers, examples)
    assert counted == [4, 5, 6]  # shards 2 and 3 only
    assert not leftover.exists()
    assert {k: (folder / shard_name(k)).stat().st_mtime_ns for k in (0, 1)} == before
    for k in range(4):  # the same bytes as an uninterrupted build
        assert (folder / shard_name(k)).read_bytes() == (tmp_path / "fresh" /
                                                          shard_name(k)).read_bytes()
    for i in range(N):
        assert_same(resumed[i], fresh[i])
    counted.clear()  # complete: reused as it is
    assert len(_build(folder, target, Numbered(target, examples), answers, examples)) == N
    assert counted == []


# --- (c) other inputs ---------------------------------------------------------------------
def test_another_picture_under_the_same_name_gives_other_keys(fp32, examples, tmp_path) -> None:
    target, _, answers = fp32
    copies = []
    for ex in examples:
        shutil.copy(ex.image_path, tmp_path / ex.image_path.name)
        copies.append(Example(ex.id, tmp_path / ex.image_path.name, ex.prompt, ex.answer))
    keys = (store_key(target, copies, answers, MEMORY, DISTILL, PER_SHARD),
            answers_key(target, copies, 8))
    assert keys == (store_key(target, examples, answers, MEMORY, DISTILL, PER_SHARD),
                    answers_key(target, examples, 8))  # the same pictures elsewhere: same keys
    tiny_image(99).save(copies[0].image_path)
    assert store_key(target, copies, answers, MEMORY, DISTILL, PER_SHARD) != keys[0]
    assert answers_key(target, copies, 8) != keys[1]


def test_a_store_of_other_inputs_is_rebuilt(fp32, examples, tmp_path, counted):
    target, _, answers = fp32
    folder = tmp_path / "features"
    _build(folder, target, Numbered(target, examples), answers, examples)
    other = [a[:1] for a in answers]  # other answers: another key
    assert store_key(target, examples, other, MEMORY, DISTILL, PER_SHARD) != store_key(
        target, examples, answers, MEMORY, DISTILL, PER_SHARD)
    assert store_key(target, examples, answers, MEMORY, (1,), PER_SHARD) != store_key(
        target, examples, answers, MEMORY, DISTILL, PER_SHARD)
    (folder / f".{shard_name(0)}.tmp").write_bytes(b"x")
    counted.clear()
    store = _build(folder, target, Numbered(target, examples), other, examples)
    assert sorted(counted) == list(range(N))
    assert [p.name for p in folder.glob(".*.tmp")] == []
    for i in range(N):
        assert torch.equal(store[i].input_ids[store[i].prompt_len:], other[i])
    with pytest.raises(Exception, match="belongs to other inputs"):
        FeatureStore.open(folder, key="0" * 16)


# --- (d) training -------------------------------------------------------------------------
def test_training_from_the_store_is_training_from_the_list(fp32, examples, tmp_path):
    target, prompts, answers = fp32
    store = _build(tmp_path / "features", target, prompts, answers, examples)
    listed = [collect_sample(target, prompts[i], answers[i], MEMORY, DISTILL) for i in range(N)]
    config = TrainConfig(warmup_steps=2, multires_steps=2, batch_size=2, unroll=1,
                         calibration_batches=2, lr_warmup_steps=1, eval_every=2,
                         checkpoint_every=100)

    data = SimpleNamespace(space=SearchSpace.default_for(target.num_layers, 4))  # build_draft's
    weights = []
    for samples in (store, listed):
        train, held = split_heldout(samples, 2)
        draft = build_draft(target, data, SupernetRecipe(num_heads=4), seed=0)
        out = train_supernet(draft, TrainingSet(train, DISTILL,
                                                HeldOut(held, 2, 6, target.eos_token_ids)),
                             config, tmp_path / f"ckpt-{len(weights)}", show_progress=False)
        assert out.steps == 4 and out.evals
        evals = [{k: v for k, v in e.items() if k != "seconds"} for e in out.evals]  # clock
        weights.append((draft.state_dict(), out.loss_curve, evals))
    (a, curve_a, evals_a), (b, curve_b, evals_b) = weights
    assert curve_a == curve_b and evals_a == evals_b
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the same checkpoint fingerprint: a run trained from either resumes from the other
    state = [json.loads((tmp_path / f"ckpt-{i}" / "state.json").read_text()) for i in (0, 1)]
    assert state[0]["fingerprint"] == state[1]["fingerprint"]


# --- (e) reading is per shard -------------------------------------------------------------
def test_reading_a_sample_opens_its_shard_only(fp32, examples, tmp_path):
    target, prompts, answers = fp32
    folder = tmp_path / "features"
    key = store_key(target, examples, answers, MEMORY, DISTILL, PER_SHARD)
    _build(folder, target, prompts, answers, examples).close()
    store = FeatureStore.open(folder, key=key, max_open=2)
    assert store.open_shards == ()
    store[5]
    assert store.open_shards == (2,)
    store.input_ids(0)
    assert store.open_shards == (2, 0)
    store[-1]  # row 6: shard 3; the least recently used (2) is closed
    assert store.open_shards == (0, 3)
    view = store[2:4]
    list(view)
    assert store.open_shards == (3, 1)  # a view shares the store's open shards
    store.close()
    assert store.open_shards == ()
    (folder / shard_name(1)).unlink()
    with pytest.raises(Exception, match="shard-00001.safetensors is missing"):
        store[3]


# --- the prompts, built per batch ---------------------------------------------------------
def test_prompts_are_built_per_chunk_and_answer_as_a_list_does(fp32, examples, monkeypatch):
    target, _, answers = fp32
    listed = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
    assert [a.tolist() for a in regenerate_answers(target.model, listed, 6,
                                                   show_progress=False)] \
        == [a.tolist() for a in answers]
    live: set[int] = set()
    most = [0]
    real = target.build_inputs

    def build(image, prompt):
        inputs = real(image, prompt)
        tag = id(inputs["pixel_values"])
        live.add(tag)
        most[0] = max(most[0], len(live))
        weakref.finalize(inputs["pixel_values"], live.discard, tag)
        return inputs

    monkeypatch.setattr(target, "build_inputs", build)
    lazy = prompt_inputs(target, examples)
    assert isinstance(lazy[:3], PromptInputs) and len(lazy[:3]) == 3
    got = regenerate_answers(target.model, lazy, 6, batch_size=2, show_progress=False)
    assert [a.tolist() for a in got] == [a.tolist() for a in answers]
    assert most[0] <= 2  # one chunk's pixels at a time, never all 7


# --- the recipe and the run folder --------------------------------------------------------
def test_prepare_data_from_a_store_equals_in_memory_and_reruns_free(fp32, examples, tmp_path,
                                                                    counted):
    target, _, _ = fp32
    recipe = SupernetRecipe(num_heads=4, max_new_tokens=6)
    memory = prepare_data(target, examples, recipe, show_progress=False)
    stored = prepare_data(target, examples, recipe, feature_store=tmp_path / "features",
                          answers_cache=tmp_path / "selfdistill.json", show_progress=False)
    assert isinstance(memory.samples, list) and isinstance(stored.samples, FeatureStore)
    assert memory.aifd == stored.aifd and memory.space == stored.space
    assert len(memory.samples) == len(stored.samples)
    for a, b in zip(memory.samples, stored.samples, strict=True):
        assert_same(a, b)
    counted.clear()
    again = prepare_data(target, examples, recipe, feature_store=tmp_path / "features",
                         answers_cache=tmp_path / "selfdistill.json", show_progress=False)
    assert counted == [] and len(again.samples) == len(memory.samples)


def test_train_run_keeps_the_store_in_the_run_folder(fp32, examples, run_dir, caplog, counted,
                                                     tmp_path):
    target, _, _ = fp32
    config = TrainConfig(warmup_steps=2, multires_steps=2, batch_size=2, unroll=1, eval_every=2,
                         checkpoint_every=100)
    with caplog.at_level(logging.INFO, logger="dreams_nas"):
        summary = train_run(run_dir, target, examples, config,
                            SupernetRecipe(max_new_tokens=6, holdout=2), show_progress=False)
    # the supernet trained from the store is the one trained from samples in memory
    memory = prepare_data(target, examples, SupernetRecipe(num_heads=4, max_new_tokens=6),
                          show_progress=False)
    other = train_run(RunFolder(tmp_path / "other"), target, examples, config,
                      SupernetRecipe(max_new_tokens=6, holdout=2), data=memory,
                      show_progress=False)
    assert other["hash"] == summary["hash"] and other["heldout_tau"] == summary["heldout_tau"]
    folder = run_dir.supernet_dir / "features"
    index = json.loads((folder / INDEX).read_text())
    assert index["complete"] and index["n_samples"] == N and index["samples_per_shard"] == 8
    names = sorted(p.name for p in folder.iterdir() if p.suffix != ".lock")
    assert names == [INDEX, shard_name(0)]
    assert any(r.getMessage().startswith("feature store: 1 shards,") for r in caplog.records)
    assert len(counted) == N  # the store computed every prompt once
    shutil.rmtree(run_dir.supernet_dir / "checkpoint")
    counted.clear()
    again = train_run(run_dir, target, examples, config,
                      SupernetRecipe(max_new_tokens=6, holdout=2), show_progress=False)
    assert counted == [] and again["hash"] == summary["hash"]  # a repeat reads the store
