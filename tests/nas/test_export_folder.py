"""`dreams-nas export SPEC --to DIR`: a self-contained folder that transformers' generate runs
with, copied alone anywhere; a changed file is refused before decoding."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _support.drafts import random_spec_folder
from _support.models import PROMPTS, tiny_image
from dreams_nas.nas import cli
from dreams_nas.supernet.core.errors import InputError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_exported_folder_copied_alone_decodes_as_generate(tiny_vlm, tiny_target, tmp_path,
                                                            capsys) -> None:
    adapter = tiny_target("llava")
    model, _ = tiny_vlm("llava")
    spec = random_spec_folder(adapter, tmp_path / "run" / "specs" / "s")
    assert cli.main(["export", str(spec), "--to", str(tmp_path / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"README.md", "hashes.json", "draft.safetensors", "custom_generate/generate.py",
            "custom_generate/requirements.txt"} <= set(summary["files"])
    card = (tmp_path / "out" / "README.md").read_text()
    assert adapter.describe()["architecture_hash"] in card and "custom_generate=" in card
    alone = tmp_path / "elsewhere" / "draft"
    shutil.copytree(tmp_path / "out", alone)
    shutil.rmtree(tmp_path / "run")  # nothing points back into the run folder
    inputs = adapter.build_inputs(tiny_image(0), PROMPTS[0])
    with torch.inference_mode():
        ref = model.generate(**inputs, max_new_tokens=10, do_sample=False)
        got = model.generate(**inputs, custom_generate=str(alone), trust_remote_code=True,
                             max_new_tokens=10, do_sample=False)
    assert got.tolist() == ref.tolist()
    # a changed file is refused before decoding (a fresh copy: the first one's draft is cached)
    changed = tmp_path / "changed"
    shutil.copytree(tmp_path / "out", changed)
    weights = changed / "draft.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(InputError, match="draft.safetensors is not the file exported"):
        model.generate(**inputs, custom_generate=str(changed), trust_remote_code=True,
                       max_new_tokens=4)
    # a non-empty destination is refused in one line
    assert cli.main(["export", str(alone), "--to", str(changed)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not empty" in err
