"""A named target is resolved by the stage that needs it: `TargetAdapter.load` builds nothing, and
`resolve_target` logs before it builds (and says nothing when the cache has it)."""

from __future__ import annotations

import logging

import pytest
from dreams_nas.supernet.builtin import cache
from dreams_nas.supernet.builtin.resolve import resolve_target
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.targets import NAMED_TARGETS
from dreams_nas.supernet.target.adapter import TargetAdapter


@pytest.mark.parametrize("name", NAMED_TARGETS)
def test_load_refuses_a_named_target_and_builds_nothing(name, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "build_builtin_target", _never)
    monkeypatch.setattr(cache, "build_proxy_target", _never)
    with pytest.raises(InputError, match=rf"^'{name}' names a built-in or proxy target, not a "
                                         r"checkpoint folder or hub id; resolve it first "
                                         r".*resolve_target"):
        TargetAdapter.load(name)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_resolve_logs_before_it_builds_and_not_when_cached(tmp_path, monkeypatch,
                                                           caplog) -> None:
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(tmp_path))
    monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")
    logged_first: list[bool] = []

    def build(out, **_: object) -> dict[str, object]:
        logged_first.append(any("building the built-in target tiny" in r.getMessage()
                                for r in caplog.records))
        (out / "config.json").write_text("{}")
        return {"exact_match": 1.0}

    monkeypatch.setattr(cache, "build_builtin_target", build)
    with caplog.at_level(logging.INFO, logger="dreams_nas"):
        folder = resolve_target("builtin", show_progress=False)
    assert folder == cache.builtin_target_dir(variant="tiny") and logged_first == [True]
    message = next(r.getMessage() for r in caplog.records if "building" in r.getMessage())
    assert message == f"building the built-in target tiny into {folder} (minutes, once)"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dreams_nas"):
        assert resolve_target("builtin") == folder  # cached: no build, no word
    assert logged_first == [True] and not caplog.records


def test_resolve_passes_a_folder_or_hub_id_through(tmp_path) -> None:
    assert resolve_target(tmp_path) == tmp_path
    assert resolve_target("llava-hf/llava-1.5-7b-hf") == "llava-hf/llava-1.5-7b-hf"


def _never(*_: object, **__: object) -> dict[str, object]:
    raise AssertionError("nothing may be built")


def test_two_spellings_of_one_cache_folder_are_one_target(tmp_path) -> None:
    """run.json records the target's folder resolved; a cache reached through a symlink or a
    relative path is the same folder, not another build."""
    from dreams_nas.supernet.builtin.resolve import same_folder

    real = tmp_path / "cache" / "builtin-target"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "cache")
    assert same_folder(tmp_path / "link" / "builtin-target", real)
    assert not same_folder(tmp_path / "cache", real)
