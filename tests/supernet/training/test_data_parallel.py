"""Training on several ranks (`supernet.core.dist`, torchrun's model) equals training in one
process: 2 CPU ranks in a gloo group split the self-distilled answers and the feature store's
shards (the shards equal one process's), train data parallel (DistributedDataParallel, each rank
half of the same global batch: the weights within 1e-5 of one process's), and a rank killed
mid-run is resumed by a relaunch."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _support.models import PROMPTS, save_tiny_vlm, tiny_image
from _support.ranks import KILLED, save_examples, spawn, train_task
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.data.prompts import Example
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run
from safetensors.torch import load_file

pytestmark = pytest.mark.usefixtures("one_thread")

N = 10  # prompts: shards of 3 (4 shards, 2 per rank); 1 held out
CONFIG = TrainConfig(warmup_steps=3, multires_steps=3, batch_size=4, unroll=2, lr=2e-3,
                     checkpoint_every=2, calibration_batches=2, eval_every=2)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    target_dir = save_tiny_vlm("llava", root / "target")
    examples = []
    for i in range(N):
        path = root / f"{i}.png"
        tiny_image(i).save(path)
        examples.append(Example(str(i), path, PROMPTS[i % len(PROMPTS)], ""))
    return root, str(target_dir), save_examples(examples, root / "examples.json"), examples


@pytest.fixture(scope="module")
def one_process(setup):
    root, target_dir, _, examples = setup
    run = RunFolder(root / "one")
    recipe = SupernetRecipe(max_new_tokens=16, aifd_prompts=2, holdout=1, samples_per_shard=3)
    summary = train_run(run, TargetAdapter.load(target_dir), examples, CONFIG, recipe,
                        show_progress=False)
    return run, summary


def _two_ranks(setup, name: str, kill=None) -> RunFolder:
    root, target_dir, examples_file, _ = setup
    run = RunFolder(root / name)
    spawn(train_task, 2, root, target_dir, examples_file, str(run.root), CONFIG.to_dict(), kill,
          16, 1)
    return run


def _shards(run: RunFolder) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted((run.supernet_dir / "features").glob("shard-*.safetensors")):
        out.update(load_file(path))
    return out


def _assert_same_training(run: RunFolder, reference: RunFolder) -> None:
    ours, theirs = _shards(run), _shards(reference)
    assert ours.keys() == theirs.keys() and len(ours) > 0
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    index = json.loads((run.supernet_dir / "features" / "index.json").read_text())
    assert index["complete"] and [e["file"] for e in index["shards"]] == [
        f"shard-{k:05d}.safetensors" for k in range(4)]
    answers = [json.loads((r.supernet_dir / "selfdistill.json").read_text())["answers"]
               for r in (run, reference)]
    assert answers[0] == answers[1]
    assert not list(run.supernet_dir.glob("selfdistill.rank*"))  # the parts are merged away
    weights = [load_file(r.supernet_dir / "model.safetensors") for r in (run, reference)]
    assert weights[0].keys() == weights[1].keys()
    worst = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[1])
    assert worst <= 1e-5, f"weights differ by up to {worst}"
    curves = [r.read_run()["supernet"]["train"]["loss_curve"] for r in (run, reference)]
    assert [c["step"] for c in curves[0]] == list(range(1, CONFIG.total_steps + 1))
    for a, b in zip(*curves, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    assert abs(curves[1][-1]["loss"] - curves[1][0]["loss"]) > 1e-3  # the weights did move
    evals = [r.read_run()["supernet"]["train"]["convergence"]["evals"] for r in (run, reference)]
    assert [e["step"] for e in evals[0]] == [e["step"] for e in evals[1]] and evals[0]


def test_two_ranks_compute_the_same_features_and_train_the_same_weights(setup, one_process):
    reference, _ = one_process
    _assert_same_training(_two_ranks(setup, "two"), reference)


def test_a_killed_rank_is_resumed_by_a_relaunch(setup, one_process):
    reference, _ = one_process
    from torch.multiprocessing import ProcessExitedException

    # rank 1 dies after its first feature shard, then (relaunched) in the middle of training
    for kill in ((1, "shard", 1), (1, "step", 4)):
        with pytest.raises(ProcessExitedException) as failed:
            _two_ranks(setup, "killed", kill)
        assert failed.value.exit_code == KILLED
    run = RunFolder(setup[0] / "killed")
    state = json.loads((run.supernet_dir / "checkpoint" / "state.json").read_text())
    assert 0 < state["step"] < CONFIG.total_steps  # it died with a checkpoint half-way
    _two_ranks(setup, "killed")
    _assert_same_training(run, reference)
    assert run.read_run()["supernet"]["train"]["loss_curve"][0]["step"] == 1
    shutil.rmtree(run.root)
