"""supernet.decoding.spec: a spec folder loads only on the target it was searched for, in its
dtype, and only when its spec.json is one this code reads."""

from __future__ import annotations

import pytest
from _support.models import build_tiny_llava
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json, atomic_write_text
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.spec import load_spec_drafter, read_spec_json, spec_dtype
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.extract import extract
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter

SPEC = SubnetSpec(2, 1.0, 2, 3)


@pytest.fixture(scope="module")
def targets():
    """Two tiny LLaVAs of one width (32) and vocabulary: 4 layers (the spec's) and 2 layers."""
    ours = TargetAdapter.from_model(build_tiny_llava(seed=0, layers=4))
    other = TargetAdapter.from_model(build_tiny_llava(seed=0, layers=2))
    return ours, other


@pytest.fixture
def folder(tmp_path, targets):
    """A spec folder exported for the 4-layer target (its spec.json as `write_spec_dir` writes
    it, less the keys the loader does not read)."""
    ours, _ = targets
    shared = SharedTargetModules(ours.embed_tokens, ours.lm_head)
    draft = DreamDraft.initialised(DraftConfig.for_target(ours.text_config, (1, 2)), shared, 0)
    path = tmp_path / "specs" / SPEC.id
    extract(draft, SPEC).save_pretrained(path)
    _write_meta(path, target=ours.describe())
    return path


def _write_meta(path, **changes) -> None:
    meta = {"schema_version": 1, "spec": SPEC.to_dict(), "spec_id": SPEC.id,
            "dtype": "float32", **changes}
    atomic_write_json(path / "spec.json", meta)


def test_the_spec_loads_on_its_own_target(folder, targets) -> None:
    ours, _ = targets
    drafter = load_spec_drafter(folder, ours)
    assert isinstance(drafter, DreamDrafter) and drafter.default_draft_len == SPEC.draft_len


def test_another_target_is_refused_naming_both(folder, targets) -> None:
    """Same width, so the draft loaded on it before, and decoded at tau 1.0 without a word."""
    ours, other = targets
    with pytest.raises(InputError) as err:
        load_spec_drafter(folder, other)
    message = str(err.value)
    assert "\n" not in message
    assert f"the spec in {folder} was searched for target a model built in memory (llava, 4 " \
           f"layers, hidden 32, architecture {ours.describe()['architecture_hash']})" in message
    assert f"but the loaded target is a model built in memory (llava, 2 layers, hidden 32, " \
           f"architecture {other.describe()['architecture_hash']})" in message
    assert message.endswith("pass the target the spec was searched for")


def test_the_target_source_is_named_in_the_fix(folder, targets) -> None:
    ours, other = targets
    _write_meta(folder, target={**ours.describe(), "id": "ckpt", "path": "/models/ckpt"})
    with pytest.raises(InputError, match=r"searched for target 'ckpt' \(llava, 4 layers.*pass "
                                         r"the target the spec was searched for \(--target "
                                         r"/models/ckpt\)$"):
        load_spec_drafter(folder, other)


def test_a_target_recorded_without_an_architecture_hash_is_refused(folder, targets) -> None:
    """Another version recorded no hash: no comparison of family, depth and width instead,
    one line naming the file and the command."""
    ours, _ = targets
    recorded = {k: v for k, v in ours.describe().items() if k != "architecture_hash"}
    _write_meta(folder, target=recorded)
    with pytest.raises(InputError, match=r"spec\.json records its target without an "
                                         r"architecture_hash: another dreams-nas version wrote "
                                         r"it; export the spec again \(`dreams-nas search`\)$"):
        load_spec_drafter(folder, ours)


def test_a_spec_without_a_recorded_target_is_not_checked(folder, targets) -> None:
    _, other = targets
    _write_meta(folder, target={})
    assert isinstance(load_spec_drafter(folder, other), DreamDrafter)
    _write_meta(folder)  # no target key at all (a hand-written folder)
    assert isinstance(load_spec_drafter(folder, other), DreamDrafter)
    _write_meta(folder, target="builtin")
    with pytest.raises(InputError, match=r"spec\.json has target='builtin', not a target object"):
        load_spec_drafter(folder, other)


@pytest.mark.parametrize("version", [99, 0, None, "1", True])
def test_an_unknown_schema_version_is_refused(folder, targets, version) -> None:
    ours, _ = targets
    _write_meta(folder, target=ours.describe(), schema_version=version)
    match = rf"spec\.json has schema_version={version!r}; this dreams-nas reads schema 1: " \
            r"export the spec again with this version \(`dreams-nas search`\)"
    with pytest.raises(InputError, match=match):
        load_spec_drafter(folder, ours)
    with pytest.raises(InputError, match=match):
        spec_dtype(folder)  # what `generate` asks first, before loading the target


@pytest.mark.parametrize(("text", "match"), [
    ("{not json", r"spec\.json is not valid JSON \(line 1\)"),
    ("[1, 2]", r"spec\.json holds an array, not a JSON object; export the spec again"),
    ('"h2-v1.00-l2-g3"', r"spec\.json holds a string, not a JSON object"),
])
def test_a_spec_json_that_is_no_object_is_one_line(folder, targets, text, match) -> None:
    ours, _ = targets
    atomic_write_text(folder / "spec.json", text)
    with pytest.raises(InputError, match=match) as err:
        load_spec_drafter(folder, ours)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=match):
        read_spec_json(folder)


def test_the_dtype_check_stays(folder, targets) -> None:
    ours, _ = targets
    _write_meta(folder, target=ours.describe(), dtype="bfloat16")
    assert spec_dtype(folder) == "bfloat16"
    with pytest.raises(InputError, match=r"searched and exported in bfloat16, but the target is "
                                         r"loaded in float32; pass --dtype bfloat16"):
        load_spec_drafter(folder, ours)


def test_a_bad_recorded_spec_names_the_file(folder, targets) -> None:
    ours, _ = targets
    _write_meta(folder, target=ours.describe(), spec={**SPEC.to_dict(), "heads": 0})
    with pytest.raises(InputError, match=r"spec\.json: SubnetSpec\.heads=0 must be at least 1"):
        load_spec_drafter(folder, ours)


def test_generate_refuses_a_spec_of_another_target(folder, tmp_path, tiny_models,
                                                   capsys) -> None:
    """The CLI: exit 2 and one line, before any token is decoded."""
    from dreams_nas.nas import cli

    checkpoint = tiny_models.save_tiny_vlm("llava", tmp_path / "ckpt")
    image = tmp_path / "cat.png"
    tiny_models.tiny_image(0).save(image)
    capsys.readouterr()  # the checkpoint writer's progress bars
    code = cli.main(["generate", "--target", str(checkpoint), "--image", str(image),
                     "--prompt", "hi", "--max-new-tokens", "4", "--device", "cpu",
                     "--drafter", str(folder), "--quiet"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.startswith("dreams-nas generate: error: the spec in ")
    assert captured.err.count("\n") == 1 and "pass the target the spec was searched for" in \
        captured.err
