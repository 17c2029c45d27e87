from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(heads=(2, 4, 8), visual_keep=(0.25, 0.5, 1.0), inject_layer=(4, 8),
                       draft_len=(1, 3, 5))


def test_spec_json_round_trip() -> None:
    spec = SubnetSpec(heads=4, visual_keep=0.5, inject_layer=12, draft_len=5)
    assert SubnetSpec.from_json(spec.to_json()) == spec
    assert SubnetSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.to_dict()["schema_version"] == 1


def test_spec_is_hashable_frozen_value() -> None:
    a = SubnetSpec(4, 0.5, 12, 5)
    b = SubnetSpec(heads=4, visual_keep=0.5, inject_layer=12, draft_len=5)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.heads = 2  # type: ignore[misc]


def test_spec_id_is_readable_and_parses_back() -> None:
    spec = SubnetSpec(heads=4, visual_keep=0.5, inject_layer=12, draft_len=5)
    assert spec.id == "h4-v0.50-l12-g5"
    assert SubnetSpec.from_id(spec.id) == spec


def test_spec_numpy_values_become_python() -> None:
    spec = SubnetSpec(np.int64(4), np.float32(0.5), np.int32(3), np.int64(2))
    assert type(spec.heads) is int and type(spec.visual_keep) is float
    json.dumps(spec.to_dict())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": 0}, r"SubnetSpec.heads=0 must be at least 1"),
        ({"visual_keep": 1.5}, r"SubnetSpec.visual_keep=1.5 must be in \(0, 1\]"),
        ({"visual_keep": 0.0}, r"SubnetSpec.visual_keep=0.0 must be in \(0, 1\]"),
        ({"inject_layer": -1}, r"SubnetSpec.inject_layer=-1 must be >= 0"),
        ({"draft_len": 0}, r"SubnetSpec.draft_len=0 must be at least 1"),
        ({"heads": 2.5}, r"SubnetSpec.heads=2.5 must be an integer"),
        ({"heads": True}, r"SubnetSpec.heads=True must be an integer"),
    ],
)
def test_invalid_spec_values(kwargs: dict, match: str) -> None:
    fields = {"heads": 4, "visual_keep": 0.5, "inject_layer": 2, "draft_len": 3, **kwargs}
    with pytest.raises(InputError, match=match):
        SubnetSpec(**fields)


def test_spec_from_dict_errors() -> None:
    with pytest.raises(InputError, match=r"missing field\(s\) \['draft_len'\]"):
        SubnetSpec.from_dict({"heads": 4, "visual_keep": 0.5, "inject_layer": 2})
    with pytest.raises(InputError, match=r"unknown field\(s\) \['head'\]"):
        SubnetSpec.from_dict({"heads": 4, "visual_keep": 0.5, "inject_layer": 2, "draft_len": 1,
                              "head": 3})
    with pytest.raises(InputError, match=r"schema_version=99 is not supported"):
        SubnetSpec.from_dict({"schema_version": 99, "heads": 4, "visual_keep": 0.5,
                              "inject_layer": 2, "draft_len": 1})
    with pytest.raises(InputError, match=r"'h4-x' is not a subnet id"):
        SubnetSpec.from_id("h4-x")


def test_enumerate_is_exactly_the_product(space: SearchSpace) -> None:
    specs = list(space.enumerate())
    expected = [SubnetSpec(*combo) for combo in itertools.product(
        space.heads, space.visual_keep, space.inject_layer, space.draft_len)]
    assert specs == expected
    assert len(specs) == len(set(specs)) == space.size == 3 * 3 * 2 * 3
    assert list(space.enumerate()) == specs  # stable order
    assert all(s in space for s in specs)


def test_sample_without_repeats_and_seeded(space: SearchSpace) -> None:
    a = space.sample(20, rng=7)
    assert len(set(a)) == 20 and all(s in space for s in a)
    assert space.sample(20, rng=np.random.default_rng(7)) == a
    assert set(space.sample(space.size, rng=1)) == set(space.enumerate())
    with pytest.raises(InputError, match=r"cannot sample 55 subnets from a space of 54"):
        space.sample(55)


def test_largest_and_smallest(space: SearchSpace) -> None:
    assert space.largest() == SubnetSpec(8, 1.0, 8, 5)
    assert space.smallest() == SubnetSpec(2, 0.25, 4, 1)


def test_validate_names_field_value_and_allowed(space: SearchSpace) -> None:
    ok = SubnetSpec(4, 0.5, 8, 3)
    assert space.validate(ok) is ok
    bad = SubnetSpec(6, 0.5, 8, 3)
    with pytest.raises(InputError, match=r"The value 6 of field 'heads' in subnet h6-v0.50-l8-g3 "
                                         r"isn't contained in the search space "
                                         r"\(allowed: \[2, 4, 8\]\)"):
        space.validate(bad)
    with pytest.raises(InputError, match=r"field 'visual_keep'.*allowed: \[0.25, 0.5, 1.0\]"):
        space.validate(SubnetSpec(4, 0.75, 8, 3))
    assert bad not in space


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": ()}, r"field 'heads' is empty"),
        ({"heads": (2, 2)}, r"field 'heads' repeats a value"),
        ({"heads": (0, 2)}, r"field 'heads' holds \[0\]; values must be at least 1"),
        ({"visual_keep": (0.5, 1.2)},
         r"field 'visual_keep' holds \[1.2\]; values must be in \(0, 1\]"),
        ({"draft_len": (0, 1)}, r"field 'draft_len' holds \[0\]"),
        ({"inject_layer": (1.5,)}, r"field 'inject_layer' holds 1.5; it needs whole numbers"),
        ({"heads": "248"}, r"field 'heads' must be a list of values"),
        ({"heads": ("a",)}, r"field 'heads' holds 'a', which is not a number"),
    ],
)
def test_invalid_space(kwargs: dict, match: str) -> None:
    fields = {"heads": (2, 4), "visual_keep": (0.5, 1.0), "inject_layer": (2,), "draft_len": (1, 2),
              **kwargs}
    with pytest.raises(InputError, match=match):
        SearchSpace(**fields)


def test_space_values_sorted() -> None:
    s = SearchSpace(heads=[8, 2, 4], visual_keep=[1, 0.5], inject_layer=[3], draft_len=[5, 1])
    assert s.heads == (2, 4, 8) and s.visual_keep == (0.5, 1.0) and s.draft_len == (1, 5)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_space_save_load_round_trip(tmp_path, space: SearchSpace, suffix: str) -> None:
    path = space.save(tmp_path / f"space{suffix}")
    assert SearchSpace.load(path) == space


def test_space_load_errors(tmp_path) -> None:
    with pytest.raises(InputError, match=r"does not exist"):
        SearchSpace.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("heads = [1, 2\n")
    with pytest.raises(InputError, match=r"bad.toml is not valid TOML"):
        SearchSpace.load(bad)
    unknown = tmp_path / "u.json"
    unknown.write_text(json.dumps({"heads": [1], "visual_keep": [1.0], "inject_layer": [1],
                                   "draft_len": [1], "gamma": [2]}))
    with pytest.raises(InputError, match=r"unknown field\(s\) \['gamma'\]"):
        SearchSpace.load(unknown)
    with pytest.raises(InputError, match=r"use a .toml or .json file"):
        SearchSpace(heads=(1,), visual_keep=(1.0,), inject_layer=(1,), draft_len=(1,)).save(
            tmp_path / "s.yaml")


def test_default_space_from_configs() -> None:
    from transformers import LlamaConfig, LlavaConfig

    target = LlavaConfig(text_config=LlamaConfig(num_hidden_layers=16, num_attention_heads=4,
                                                 hidden_size=128))
    draft = LlamaConfig(num_attention_heads=8, hidden_size=128)
    space = SearchSpace.from_configs(target, draft)
    assert space.heads == (2, 4, 6, 8)
    assert space.inject_layer == (4, 8, 12, 16)
    assert space.visual_keep == (0.25, 0.5, 0.75, 1.0)
    assert space.draft_len == tuple(range(1, 8))
    small = SearchSpace.default_for(num_target_layers=2, num_draft_heads=2)
    assert small.heads == (1, 2) and small.inject_layer == (1, 2)
