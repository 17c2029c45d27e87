"""`dreams-nas train` end to end on a tiny saved target and a synthetic JSONL file."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from _support.models import save_tiny_vlm
from dreams_nas.nas.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from dreams_nas.supernet.data.prompts import write_synthetic

    root = tmp_path_factory.mktemp("train-cli")
    target = save_tiny_vlm("llava", root / "target")
    jsonl = write_synthetic(root / "data", 4, "train", seed=0)
    return root, target, jsonl


@pytest.fixture(scope="module")
def trained(setup):
    """(run folder, exit code, stdout) of one `dreams-nas train` into root/run, shared by the
    tests that read that run, so each of them can run alone."""
    root, target, jsonl = setup
    run = root / "run"
    argv = ["train", "--run", str(run), "--target", str(target), "--data", str(jsonl),
            "--warmup-steps", "2", "--multires-steps", "2", "--batch-size", "2", "--unroll", "1",
            "--max-new-tokens", "4", "--depth", "2", "--mlp", "0.5,1", "--device", "cpu",
            "--phase2-depths", "sandwich", "--json", "-q"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return run, code, out.getvalue()


def test_train_writes_the_run_and_prints_a_summary(setup, trained):
    _, target, _ = setup
    run, code, out = trained
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 4 and len(summary["hash"]) == 16
    assert (run / "supernet" / "model.safetensors").is_file()
    data = json.loads((run / "run.json").read_text())
    assert {"target", "space", "supernet", "aifd"} <= set(data)
    assert data["target"]["path"] == str(target.resolve())
    assert data["supernet"]["train"]["config"]["unroll"] == 1  # --unroll, not the space's depth
    # the one-layer anchor: phase 1's by default, phase 2's off by --phase2-depths sandwich
    anchors = [data["supernet"]["train"]["config"][f"phase{i}_shallowest"] for i in (1, 2)]
    assert anchors == [True, False]
    # --depth 2 --mlp 0.5,1: elastic depth and width, searched
    assert (data["space"]["depth"], data["space"]["mlp"]) == ([1, 2], [0.5, 1.0])
    config = data["supernet"]["config"]
    assert (config["num_layers"], config["mlp_shares"]) == (2, [0.5, 1.0])


@pytest.mark.parametrize("argv, message", [
    (["--data", "missing.jsonl"], "does not exist"),
    (["--data", "notes.txt"], "neither builtin nor a .jsonl"),
    (["--device", "cuda:7"], "does not exist on this machine"),
    (["--warmup-steps", "0", "--multires-steps", "0"], "train for at least one step"),
    (["--mlp", "0.5,0"], "0 is out of range"),
    (["--mlp", ","], "lists no share"),
    (["--depth", "0"], "0 is out of range"),
])
def test_bad_input_is_a_one_line_error(setup, capsys, argv, message):
    root, target, jsonl = setup
    base = ["train", "--run", str(root / "bad"), "--target", str(target), "--data", str(jsonl)]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_generate_with_an_extracted_spec_folder(setup, trained, capsys):
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.draft.saving import load_supernet

    _, target, jsonl = setup
    run, code, _ = trained
    assert code == 0
    spec = SubnetSpec(2, 0.5, 2, 3)
    folder = run / "specs" / spec.id
    extract(load_supernet(run / "supernet"), spec).save_pretrained(folder)
    atomic_write_json(folder / "spec.json", {"schema_version": 1, "spec": spec.to_dict()})
    image = next((jsonl.parent / "images").glob("*.png"))
    base = ["generate", "--target", str(target), "--image", str(image), "--prompt",
            "what color is the car ?", "--max-new-tokens", "8", "--json", "-q"]
    outputs = []
    for drafter in ("none", str(folder)):
        assert main(base + ["--drafter", drafter]) == 0
        outputs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outputs[1]["tokens"] == outputs[0]["tokens"]
    assert outputs[1]["draft_len"] == 3


@pytest.fixture
def no_target_load(monkeypatch):
    """Fail the test if anything loads the target: the checks must come before it."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr("dreams_nas.supernet.target.adapter.TargetAdapter.load", refuse)


def test_a_non_utf8_data_file_fails_before_the_target_loads(setup, tmp_path, capsys,
                                                             no_target_load):
    root, target, jsonl = setup
    lines = jsonl.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(lines[0] + lines[1].replace(b'"gpt"', b'"gpt\xe9"'))
    for image in (jsonl.parent / "images").iterdir():  # the lines' image paths resolve here too
        (tmp_path / "images").mkdir(exist_ok=True)
        (tmp_path / "images" / image.name).write_bytes(image.read_bytes())
    argv = ["train", "--run", str(tmp_path / "run"), "--target", str(target), "--data", str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"error: {bad}:2: byte {len(lines[0]) + lines[1].index(b'gpt') + 3} (0xe9) is not " \
           "UTF-8" in err


@pytest.mark.parametrize("argv, message", [
    (["--lambda-kl", "0", "--lambda-distill", "0", "--lambda-feat", "0"],
     "--lambda-kl 0 --lambda-feat 0 with --lambda-distill 0 leaves no loss to train on"),
    (["--lambda-kl", "0", "--lambda-feat", "0", "--distill", "none"],
     "--lambda-kl 0 --lambda-feat 0 with --distill none leaves no loss to train on"),
])
def test_a_loss_of_zero_weights_is_refused_before_anything_loads(setup, capsys, no_target_load,
                                                                 argv, message):
    root, target, jsonl = setup
    base = ["train", "--run", str(root / "zero"), "--target", str(target), "--data", str(jsonl)]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (root / "zero").exists()


def test_a_read_only_run_folder_is_one_line_exit_2(setup, tmp_path, capsys, monkeypatch):
    """A run folder on a read-only disk: a real chmod where it binds, else (root, which chmod
    does not stop) every atomic write raises EROFS as a read-only mount would."""
    import errno
    import os

    _, target, jsonl = setup
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o555)
    if os.geteuid() == 0 or os.access(run, os.W_OK):
        def read_only(path, data):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

        monkeypatch.setattr("dreams_nas.supernet.core.io.atomic_write_bytes", read_only)
    argv = ["train", "--run", str(run), "--target", str(target), "--data", str(jsonl),
            "--warmup-steps", "1", "--multires-steps", "0", "--batch-size", "2",
            "--max-new-tokens", "2", "--device", "cpu", "-q"]
    try:
        code = main(argv)
    finally:
        os.chmod(run, 0o755)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dreams-nas train: error: ") and err.count("\n") == 1
    assert str(run) in err and "internal error" not in err
    assert os.strerror(errno.EROFS) in err or os.strerror(errno.EACCES) in err


def test_train_to_a_plateau_keeps_the_best_evaluation(setup, capsys):
    """With held-out prompts the run evaluates held-out tau, stops phase 2 at a plateau (here
    at once: no gain beats the tolerance), keeps the best evaluation and writes the curve."""
    import csv

    from dreams_nas.supernet.data.prompts import write_synthetic

    root, target, _ = setup
    jsonl = write_synthetic(root / "data8", 8, "train", seed=1)
    run = root / "plateau"
    argv = ["train", "--run", str(run), "--target", str(target), "--data", str(jsonl),
            "--warmup-steps", "2", "--multires-steps", "40", "--batch-size", "2", "--unroll", "1",
            "--holdout", "2", "--eval-every", "2", "--patience", "2", "--tolerance", "100",
            "--max-new-tokens", "4", "--depth", "2", "--mlp", "0.5,1", "--device", "cpu",
            "--json", "-q"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["stopped"] == "plateau" and summary["steps"] == 8
    assert summary["max_steps"] == 42 and summary["best_step"] in (4, 6, 8)
    train = json.loads((run / "run.json").read_text())["supernet"]["train"]
    conv = train["convergence"]
    assert [e["step"] for e in conv["evals"]] == [2, 4, 6, 8]
    assert conv["best"]["step"] == conv["best_step"] == summary["best_step"]
    assert train["n_heldout"] == 2 and train["n_samples"] == 6
    with (run / "supernet" / "curve.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    assert [r["step"] for r in rows if r["tau_full"]] == ["2", "4", "6", "8"]
    assert main(argv[:-2] + ["--holdout", "8", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--holdout 8" in err[0]
