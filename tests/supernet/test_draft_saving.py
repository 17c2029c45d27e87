"""A damaged supernet folder (garbage config.json, truncated model.safetensors) is one
InputError naming the file, what is wrong and the fix, never a JSON or safetensors traceback."""

from __future__ import annotations

import json

import pytest
from _support.drafts import tiny_draft, tiny_shared
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.draft.saving import load_supernet, read_supernet_config, save_supernet

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def supernet(tmp_path):
    folder = tmp_path / "supernet"
    save_supernet(tiny_draft(), folder)
    return folder


def _config(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize(("damage", "match"), [
    (lambda c: '{"hidden_size": 32, ', r"config\.json is not valid JSON \(line 1: "),
    (lambda c: "[1, 2]", r"config\.json holds a JSON list, not the config object"),
    (lambda c: b"\xff\xfe{}", r"config\.json is not UTF-8 text \(byte 0\)"),
    (lambda c: json.dumps({k: v for k, v in c.items() if k != "vocab_size"}),
     r"config\.json is not a valid draft config \(.*vocab_size"),
    (lambda c: json.dumps({**c, "hidden_size": "wide"}),
     r"config\.json is not a valid draft config \(hidden_size='wide' is not a whole number"),
    (lambda c: json.dumps({**c, "head_dim": "8"}),
     r"config\.json is not a valid draft config \("),
    (lambda c: json.dumps({**c, "inject_layers": ["x"]}),
     r"config\.json is not a valid draft config \("),
    (lambda c: json.dumps({**c, "cross_attention": "yes"}),
     r"cross_attention='yes' is not true or false"),
], ids=["cut", "list", "latin1", "missing-key", "str-size", "str-head-dim", "str-layer",
        "str-bool"])
def test_a_garbage_config_is_one_line_naming_file_and_fix(supernet, damage, match) -> None:
    text = damage(_config(supernet))
    path = supernet / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    for read in (lambda: read_supernet_config(supernet), lambda: load_supernet(supernet)):
        with pytest.raises(InputError, match=match) as info:
            read()
        message = str(info.value)
        assert "\n" not in message and str(path) in message
        assert message.endswith("retrain the supernet with `dreams-nas train` (it rewrites both "
                                "files)")


def test_a_truncated_weights_file_is_one_line_naming_file_and_fix(supernet) -> None:
    weights = supernet / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(InputError, match=r"model\.safetensors is not a readable safetensors file, "
                                         r"likely cut short .*; retrain the supernet with "
                                         r"`dreams-nas train`") as info:
        load_supernet(supernet, tiny_shared(0))
    assert "\n" not in str(info.value) and str(weights) in str(info.value)


def test_weights_of_another_shape_are_one_line(supernet, tmp_path) -> None:
    save_supernet(tiny_draft(num_heads=2), tmp_path / "other")
    (supernet / "model.safetensors").write_bytes(
        (tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(InputError, match=r"model\.safetensors does not fit its config\.json "
                                         r"\(.*\); retrain"):
        load_supernet(supernet, tiny_shared(0))


def test_a_disk_error_while_saving_is_the_os_error_it_is(tmp_path, monkeypatch) -> None:
    """safetensors wraps a read-only or full disk in its own SafetensorError (exit 1, "internal
    error", at the CLI); it comes out as the OSError, naming the file, that the CLI reports as
    the user's environment."""
    import errno

    from safetensors import SafetensorError

    def full(*_args, **_kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    with pytest.raises(OSError) as info:
        save_supernet(tiny_draft(), tmp_path / "supernet")
    assert info.value.errno == errno.ENOSPC
    assert info.value.filename == str(tmp_path / "supernet" / "model.safetensors")
