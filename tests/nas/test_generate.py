"""`dreams-nas generate` end to end on a tiny LLaVA checkpoint folder, and its input errors."""

from __future__ import annotations

import json
import re
import struct
import zlib

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
    # a token tree: the oracle drafts the tree 2x2 each cycle, the output stays greedy
    code, out, err = _run(capsys, *base, "--drafter", "oracle", "--tree", "2x2")
    assert code == 0, err
    tree = json.loads(out)
    assert tree["tokens"] == plain["tokens"] and (tree["tree"], tree["draft_len"]) == ("2x2", 2)
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
    (["--image", "{root}/bomb.png"], r"image file .*bomb.png' is too large to decode "
                                     r"\(400,000,000 pixels, .*; resize it"),
    (["--image", "{root}"], r"image file .*' is a folder"),
    (["--tree", "2y1"], r"'2y1' is not a tree shape; shapes look like '4x2x1'"),
    (["--tree", "2x2", "--draft-len", "3"],
     r"--draft-len 3 and --tree 2x2 \(draft_len 2\) disagree"),
    # HF_HUB_OFFLINE=1 (tests/conftest.py): a hub id not in the cache fails at once, no retries
    (["--target", "nobody/not-in-the-cache"], r"hub id 'nobody/not-in-the-cache' is not in the "
                                               r"local Hugging Face cache and offline mode is on"),
    (["--max-new-tokens", "5000"], r"the prompt's \d+ tokens \(image included\) \+ "
                                   r"--max-new-tokens 5000 = \d+ exceeds the target's 1024 "
                                   r"positions \(max_position_embeddings\); give "
                                   r"--max-new-tokens \d+ or fewer"),
])
def test_bad_input_is_one_line_exit_2(checkpoint, capsys, extra, match) -> None:
    folder, image = checkpoint
    root = folder.parent
    (root / "broken.png").write_text("not a png")
    (root / "bomb.png").write_bytes(png_header(20000, 20000))
    args = {"--target": str(folder), "--image": str(image), "--prompt": "hi"}
    for key, value in zip(extra[::2], extra[1::2], strict=True):
        args[key] = value.format(root=root)
    argv = ["generate", "-q"] + [x for kv in args.items() for x in kv]  # -q: no load bars
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dreams-nas generate: error: ")
    assert re.search(match, err), err


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels in under 100 bytes: Pillow reads the size from
    the header before decoding anything, so this is a 20000 x 20000 image as far as it knows."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))
