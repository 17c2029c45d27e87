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
            "--warmup-steps", "2", "--multires-steps", "2", "--batch-size", "2",
            "--max-new-tokens", "4", "--device", "cpu", "--json", "-q"]
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


@pytest.mark.parametrize("argv, message", [
    (["--data", "missing.jsonl"], "does not exist"),
    (["--data", "notes.txt"], "neither builtin nor a .jsonl"),
    (["--device", "cuda:7"], "does not exist on this machine"),
    (["--warmup-steps", "0", "--multires-steps", "0"], "train for at least one step"),
])
def test_bad_input_is_a_one_line_error(setup, capsys, argv, message):
    root, target, jsonl = setup
    base = ["train", "--run", str(root / "bad"), "--target", str(target), "--data", str(jsonl)]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_generate_with_an_extracted_spec_folder(setup, trained, capsys):
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.core.space import SubnetSpec
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.draft.store import load_supernet

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
