"""`dreams-nas generate` end to end on a tiny LLaVA checkpoint folder, and its input errors."""

from __future__ import annotations

import json
import re

import pytest
from dreams_nas.nas import cli


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_models):
    save_tiny_vlm, tiny_image = tiny_models.save_tiny_vlm, tiny_models.tiny_image
    root = tmp_path_factory.mktemp("generate")
    folder = save_tiny_vlm("llava", root / "ckpt")
    image = root / "cat.png"
    tiny_image(0).save(image)
    return folder, image


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_matches_plain_decoding(checkpoint, capsys) -> None:
    folder, image = checkpoint
    base = ["generate", "--target", str(folder), "--image", str(image),
            "--prompt", "what is in the image ?", "--max-new-tokens", "8", "--device", "cpu",
            "--json"]
    code, out, err = _run(capsys, *base, "--drafter", "none")
    assert code == 0, err
    plain = json.loads(out)
    assert plain["tau"] == 1.0 and plain["new_tokens"] == len(plain["tokens"]) <= 8
    for drafter in ("lookup", "oracle"):
        code, out, err = _run(capsys, *base, "--drafter", drafter, "--draft-len", "3")
        assert code == 0, err
        summary = json.loads(out)
        assert summary["tokens"] == plain["tokens"]  # lossless
        assert {"text", "tau", "target_forwards", "tokens_per_s"} <= set(summary)
        if drafter == "oracle" and len(plain["tokens"]) == 8:
            assert summary["target_forwards"] == 3  # prefill + ceil(7 / (3 + 1)) verify steps
    # the ids decode to the printed text; without --json the text goes to stdout
    code, out, _ = _run(capsys, *base[:-1])
    assert code == 0 and out.strip() == plain["text"]


@pytest.mark.parametrize(("extra", "match"), [
    (["--image", "{root}/missing.png"], "image file .*missing.png' does not exist"),
    (["--image", "{root}/broken.png"], "cannot be read as an image"),
    (["--target", "{root}"], "holds no config.json"),
    (["--drafter", "eagle"], "unknown drafter 'eagle'"),
    (["--draft-len", "0"], "argument --draft-len: 0 is out of range: give a number from 1 to 64"),
    (["--draft-len", "1000"], "argument --draft-len: 1000 is out of range"),
])
def test_bad_input_is_one_line_exit_2(checkpoint, capsys, extra, match) -> None:
    folder, image = checkpoint
    root = folder.parent
    (root / "broken.png").write_text("not a png")
    args = {"--target": str(folder), "--image": str(image), "--prompt": "hi"}
    for key, value in zip(extra[::2], extra[1::2], strict=True):
        args[key] = value.format(root=root)
    argv = ["generate"] + [x for kv in args.items() for x in kv]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dreams-nas generate: error: ")
    assert re.search(match, err), err
