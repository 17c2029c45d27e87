"""The demo's stage sizes come from the built-in target variant (`BuiltinVariant.demo`): the
real pipeline's on `default` (and on a proxy target), test sizes on `tiny`; a flag given wins."""

from __future__ import annotations

from dataclasses import fields

import pytest
from dreams_nas.nas.stages.demo import DemoOptions, sized
from dreams_nas.nas.stages.train import TrainOptions
from dreams_nas.supernet.builtin.variants import VARIANT_ENV, VARIANTS, DemoSizes


def _sizes(options: DemoOptions) -> dict:
    train = options.train
    return {"train_prompts": train.n_train, "train_steps": (train.warmup_steps,
                                                            train.multires_steps),
            "profile_budget": options.profile_budget, "profile_repeats": options.profile_repeats,
            "limit": options.limit, "max_new_tokens": (options.max_new_tokens,
                                                       train.max_new_tokens),
            "verify_prompts": options.verify_prompts}


REAL = {"train_prompts": None, "train_steps": (None, None), "profile_budget": None,
        "profile_repeats": 40, "limit": None, "max_new_tokens": (64, 64), "verify_prompts": None}


def test_the_default_variant_keeps_the_real_pipeline(monkeypatch) -> None:
    monkeypatch.delenv(VARIANT_ENV, raising=False)
    assert VARIANTS["default"].demo == DemoSizes()
    assert _sizes(sized(DemoOptions())) == REAL
    # the real pipeline's own defaults stay where they were: TrainConfig's steps, 384 prompts
    assert TrainOptions().config().warmup_steps == 300
    assert sized(DemoOptions()).train == TrainOptions()


def test_a_proxy_target_keeps_the_real_pipeline(monkeypatch) -> None:
    monkeypatch.setenv(VARIANT_ENV, "tiny")
    assert _sizes(sized(DemoOptions(target="proxy-llava-tiny"))) == REAL


def test_the_tiny_variant_takes_its_demo_sizes(monkeypatch) -> None:
    monkeypatch.setenv(VARIANT_ENV, "tiny")
    tiny = VARIANTS["tiny"].demo
    assert all(getattr(tiny, f.name) is not None for f in fields(DemoSizes))
    got = _sizes(sized(DemoOptions()))
    assert got == {"train_prompts": tiny.train_prompts,
                   "train_steps": (tiny.train_steps, tiny.train_steps),
                   "profile_budget": tiny.profile_budget,
                   "profile_repeats": tiny.profile_repeats, "limit": tiny.limit,
                   "max_new_tokens": (tiny.max_new_tokens, tiny.max_new_tokens),
                   "verify_prompts": tiny.verify_prompts}
    # a few steps: the tiny demo trains in seconds, not 300 + 400 steps
    assert tiny.train_steps <= 50 and tiny.train_prompts <= 32


def test_a_flag_given_wins_over_the_variants_size(monkeypatch, tmp_path, capsys) -> None:
    from dreams_nas.nas import cli
    from dreams_nas.nas.stages import demo

    monkeypatch.setenv(VARIANT_ENV, "tiny")
    asked = []
    monkeypatch.setattr(demo, "run_demo", lambda run, options: asked.append(options) or {})
    assert cli.main(["demo", "--run", str(tmp_path / "run"), "--train-steps", "3",
                     "--max-new-tokens", "7", "--repeats", "2", "--limit", "1", "--json"]) == 0
    capsys.readouterr()
    (options,) = asked
    options = sized(options)
    tiny = VARIANTS["tiny"].demo
    assert options.train.warmup_steps == options.train.multires_steps == 3
    assert options.max_new_tokens == options.train.max_new_tokens == 7
    assert options.profile_repeats == 2 and options.limit == 1
    # the sizes not given are the variant's
    assert options.train.n_train == tiny.train_prompts
    assert options.profile_budget == tiny.profile_budget
    assert options.verify_prompts == tiny.verify_prompts


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_has_demo_sizes(name) -> None:
    assert isinstance(VARIANTS[name].demo, DemoSizes)
