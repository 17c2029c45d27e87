"""Every supported family through every command: `train`, `profile`, `score` and `generate` of
the real CLI on a saved tiny checkpoint of each family and a tiny synthetic JSONL, in float32
and in bfloat16 (`train --dtype`; the later commands take the run's dtype from run.json).

A case that fails for a known library bug is marked in `KNOWN_BUGS` (strict xfail, so the mark
goes the day the bug is fixed), never skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _support.checkpoints import save_checkpoint, serve_processors
from _support.cli import call_cli
from _support.models import FAMILIES
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.target.families import SUPPORTED_FAMILIES

# slow: ~5 s a family and dtype on 2 cores, most of it `profile` fitting its predictor
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TRAIN = ["--warmup-steps", "1", "--multires-steps", "1", "--batch-size", "2",
         "--max-new-tokens", "4", "--n-train", "2", "--device", "cpu"]
# above every tiny family's visual tokens in the synthetic 48 x 48 images, counted through its
# processor (LLaVA-NeXT has the most: 88 by its any-resolution tiling, where a square of its
# vision config's image_size gives 36)
# --holdout 0: the predictor is fitted once (its hold-out evaluation is tested elsewhere)
CONTEXT = 128
PROFILE = ["--device", "cpu", "--threads", "1", "--repeats", "2", "--passes", "1",
           "--budget", "2", "--context-lengths", str(CONTEXT), "--holdout", "0"]
DTYPES = ("float32", "bfloat16")
SPEC = SubnetSpec(2, 0.5, 2, 3)  # in the default space of every tiny target (2 layers, 4 heads)

# (family, command) -> the library bug that makes it fail; strict xfail
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def _families(command: str) -> list:
    return [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[f, command]))
            if (f, command) in KNOWN_BUGS else f for f in FAMILIES]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from dreams_nas.supernet.data.prompts import write_synthetic

    root = tmp_path_factory.mktemp("every-family-data")
    train = write_synthetic(root, 2, "train", seed=0)
    evaluation = write_synthetic(root, 1, "eval", seed=0)
    return {"train": train, "eval": evaluation, "image": sorted((root / "images").glob("*.png"))[0]}


@pytest.fixture(scope="module")
def served_processors():
    """folder -> processor that `AutoProcessor.from_pretrained` serves for this module."""
    processors: dict[Path, object] = {}
    with pytest.MonkeyPatch.context() as patch:
        serve_processors(patch, processors)
        yield processors


@pytest.fixture(scope="module")
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module", params=DTYPES)
def dtype(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def trained(family, dtype, data, served_processors, tmp_path_factory):
    """(target folder, run folder, train's exit code, summary, stderr), once per family and
    dtype."""
    root = tmp_path_factory.mktemp(f"every-family-{family}-{dtype}")
    target, processor = save_checkpoint(family, root / "target")
    if processor is not None:
        served_processors[target.resolve()] = processor
    run = root / "run"
    code, summary, err = call_cli("train", "--run", str(run), "--target", str(target),
                              "--data", str(data["train"]), "--dtype", dtype, *TRAIN)
    return target, run, code, summary, err


def _supernet(trained) -> tuple[Path, Path]:
    target, run, code, _, err = trained
    assert code == 0, f"train failed, so nothing to run on: {err}"
    return target, run


def test_the_tests_know_every_supported_family() -> None:
    assert set(FAMILIES) == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("family", _families("train"), indirect=True)
def test_train(family, dtype, trained) -> None:
    from safetensors import safe_open

    target, run, code, summary, err = trained
    assert code == 0, err
    assert summary["steps"] == 2 and summary["n_samples"] == 2
    assert {"model.safetensors", "config.json"} <= {p.name for p in (run / "supernet").iterdir()}
    meta = json.loads((run / "run.json").read_text())
    described = meta["target"]
    assert described["family"] == family and described["path"] == str(target.resolve())
    assert meta["dtype"] == dtype and meta["supernet"]["train"]["compute_dtype"] == dtype
    with safe_open(str(run / "supernet" / "model.safetensors"), "pt") as weights:
        saved = {weights.get_tensor(k).dtype for k in weights.keys()}
    assert {str(d) for d in saved} == {"torch.float32"}  # fp32 master weights


@pytest.mark.parametrize("family", _families("profile"), indirect=True)
def test_profile(family, dtype, trained, data) -> None:
    target, run = _supernet(trained)
    code, summary, err = call_cli("profile", "--run", str(run), "--target", str(target), *PROFILE,
                                  "--data", str(data["eval"]), "--limit", "1")
    assert code == 0, err
    folder = run / "latency" / summary["hardware_id"]
    rows = pd.read_csv(folder / "profile.csv")
    assert len(rows) == summary["rows"] > 0 and set(rows["status"]) == {"ok"}
    assert set(rows["context_len"]) == {CONTEXT}
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["data_contexts"]["n_prompts"] == 1  # the visual tokens counted on the data
    assert plan["visual_tokens"] == plan["data_contexts"]["visual_tokens"]["median"] > 0
    assert summary["dtype"] == dtype and set(rows["dtype"]) == {dtype}
    assert json.loads((folder / "predictor.json").read_text())["fingerprint"]["dtype"] == dtype


@pytest.mark.parametrize("family", _families("score"), indirect=True)
def test_score(family, dtype, trained, data, tmp_path) -> None:
    _, run = _supernet(trained)
    specs = tmp_path / "specs.txt"
    specs.write_text(SPEC.id + "\n")
    code, summary, err = call_cli("score", "--run", str(run), "--data", str(data["eval"]),
                              "--limit", "1", "--max-new-tokens", "4", "--specs", str(specs),
                              "--device", "cpu")
    assert code == 0, err
    assert summary["n_specs"] == 1  # teacher forcing scores its every draft length at once
    rows = pd.read_csv(summary["acceptance"]).set_index("spec_id")
    assert len(rows) == summary["n_scored"] and rows.loc[SPEC.id, "tau"] >= 1
    assert summary["dtype"] == dtype and set(rows["dtype"]) == {dtype}


@pytest.mark.parametrize("family", _families("generate"), indirect=True)
def test_generate_with_an_extracted_spec_folder(family, dtype, trained, data) -> None:
    import torch
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.draft.saving import load_supernet

    target, run = _supernet(trained)
    folder = run / "specs" / SPEC.id
    extract(load_supernet(run / "supernet").to(getattr(torch, dtype)), SPEC).save_pretrained(folder)
    atomic_write_json(folder / "spec.json", {"schema_version": 1, "spec": SPEC.to_dict(),
                                             "dtype": dtype})
    base = ["generate", "--run", str(run), "--target", str(target), "--image", str(data["image"]),
            "--prompt", "what color is the car ?", "--max-new-tokens", "4", "--device", "cpu"]
    outputs = []
    for drafter in (["--drafter", "none", "--dtype", dtype], ["--drafter", str(folder)]):
        code, summary, err = call_cli(*base, *drafter)
        assert code == 0, err
        outputs.append(summary)
    plain, drafted = outputs
    assert drafted["tokens"] == plain["tokens"] and len(drafted["tokens"]) >= 1  # lossless
    assert drafted["draft_len"] == SPEC.draft_len and drafted["target"]["family"] == family
    assert drafted["dtype"] == plain["dtype"] == dtype  # the spec's dtype, without --dtype
    assert drafted["steps"] == "dynamic" and drafted["compile_s"] == {}  # auto on the CPU
