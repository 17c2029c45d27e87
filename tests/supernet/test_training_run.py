"""`train_run`: the run folder and run.json keys that `dreams-nas train` writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from _support.models import build_tiny_vlm, tiny_image
from dreams_nas.supernet.core.device import resolve_device
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.draft.saving import file_hash
from dreams_nas.supernet.target.adapter import TargetAdapter
from dreams_nas.supernet.training.config import TrainConfig
from dreams_nas.supernet.training.recipe import SupernetRecipe, draft_for_run, train_run

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Ex:
    id: str
    image_path: Path
    prompt: str
    answer: str = ""


def _target_and_examples(tmp_path: Path, n: int) -> tuple[TargetAdapter, list[Ex]]:
    model, processor = build_tiny_vlm("llava")
    examples = []
    for i in range(n):
        path = tmp_path / f"{i}.png"
        tiny_image(i).save(path)
        examples.append(Ex(str(i), path, "what color is the car ?"))
    return TargetAdapter.from_model(model, processor), examples


def test_train_run_writes_the_supernet_and_run_json(tmp_path, run_dir):
    target, examples = _target_and_examples(tmp_path, 6)
    config = TrainConfig(warmup_steps=3, multires_steps=3, batch_size=3, checkpoint_every=2)
    summary = train_run(run_dir, target, examples, config, SupernetRecipe(max_new_tokens=6),
                        show_progress=False)
    weights = run_dir.supernet_dir / "model.safetensors"
    assert summary["hash"] == file_hash(weights)
    data = run_dir.read_run()
    assert data["supernet"]["hash"] == summary["hash"]
    assert data["supernet"]["train"]["warmup_steps"] == 3
    curve = data["supernet"]["train"]["loss_curve"]
    assert [row["step"] for row in curve] == list(range(1, 7))
    assert {"loss", "kl", "distill", "feat"} <= set(curve[0])
    aifd = data["aifd"]
    assert aifd["layers"] == [1, 2] and len(aifd["ae"]) == 2 and aifd["delta_ae"][0] == 0.0
    assert aifd["chosen"] and aifd["rule"]
    assert data["target"]["num_layers"] == 2
    space = SearchSpace.from_dict(data["space"])
    assert space.inject_layer == (1, 2) and space.heads == (1, 2, 3, 4)
    assert space.trees and space.max_draft_len == 7  # the default space: chains and token trees
    # the training-time test unrolls as deep as the space drafts (draft_len 7: 6 passes after
    # the teacher-forced one)
    assert data["supernet"]["train"]["config"]["unroll"] == space.max_draft_len - 1
    draft = draft_for_run(target, run_dir)
    assert draft.config.inject_layers == (1, 2)
    again = train_run(run_dir, target, examples, config, SupernetRecipe(max_new_tokens=6),
                      show_progress=False)
    assert again["resumed_from"] == 6 and again["hash"] == summary["hash"]


def test_a_draft_vocabulary_is_ranked_by_the_answers_and_saved(tmp_path, run_dir):
    import torch
    from dreams_nas.supernet.core.io import read_json
    from dreams_nas.supernet.training.vocab import frequency_order

    target, examples = _target_and_examples(tmp_path, 4)
    config = TrainConfig(warmup_steps=2, multires_steps=2, batch_size=2, checkpoint_every=10)
    train_run(run_dir, target, examples, config,
              SupernetRecipe(max_new_tokens=6, holdout=0, draft_vocab=(0.5, 1.0)),
              show_progress=False)
    data = run_dir.read_run()
    assert SearchSpace.from_dict(data["space"]).draft_vocab == (0.5, 1.0)
    vocab = data["supernet"]["draft_vocab"]
    size = int(target.text_config.vocab_size)
    assert vocab["shares"] == [0.5, 1.0] and vocab["tokens"]["0.5"] == -(-size // 2)
    assert vocab["answer_coverage"]["1"] == 1.0 and 0 < vocab["answer_coverage"]["0.5"] <= 1
    answers = read_json(run_dir.supernet_dir / "selfdistill.json")["answers"]
    order = frequency_order([torch.tensor(a) for a in answers], size)
    assert torch.equal(draft_for_run(target, run_dir).vocab_order, order)


def test_device_errors_name_the_devices():
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(InputError, match="does not exist on this machine"):
        resolve_device("cuda:7")
    with pytest.raises(InputError,
                       match=r"--device .gpu0. is not a device; use auto, cpu or cuda:N"):
        resolve_device("gpu0")
