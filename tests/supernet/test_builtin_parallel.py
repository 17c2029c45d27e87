"""The built-in target's data-parallel training: two local ranks train the model one process
would."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from dreams_nas.supernet.builtin.build import build_config, build_processor, init_model
from dreams_nas.supernet.builtin.parallel import train_on_ranks
from dreams_nas.supernet.builtin.training import Encoder, train_target
from dreams_nas.supernet.builtin.variants import VARIANTS, get_variant
from dreams_nas.supernet.core.dist import World
from dreams_nas.supernet.core.errors import InputError
from transformers import LlavaForConditionalGeneration


@pytest.fixture(scope="module")
def setup():
    spec = get_variant("tiny")
    processor = build_processor()
    config = build_config(replace(spec, text_layers=1), processor.tokenizer)

    def fresh() -> LlavaForConditionalGeneration:
        return init_model(config, 0)

    return spec, processor, fresh


def test_two_ranks_train_what_one_process_trains(setup) -> None:
    spec, processor, fresh = setup
    cfg = replace(spec.train, max_steps=8, eval_every=4)
    one, two = fresh(), fresh()
    with torch.random.fork_rng(devices=[]):
        alone = train_target(one, Encoder(processor), cfg, data_seed=0)
    events: list[tuple] = []
    parallel = train_on_ranks(two, cfg, ranks=2, threads_per_rank=1, data_seed=0,
                              on_step=lambda *event: events.append(event))
    assert parallel["steps"] == alone["steps"] == 8
    assert [h["val_exact_match"] for h in parallel["val_history"]] == [
        h["val_exact_match"] for h in alone["val_history"]]
    assert [e[0] for e in events] == list(range(8))  # every step reached the parent, in order
    for a, b in zip(alone["loss_curve"], parallel["loss_curve"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    # The weights agree up to what float-rounding-different gradients make of eight AdamW
    # steps, whose sizes do not scale with the gradient's (the gap depends on the CPU's vector
    # units): measured against how far training moved the weights from their start.
    state, start = one.state_dict(), fresh().state_dict()
    diff = torch.cat([(state[k] - v).flatten() for k, v in two.state_dict().items()])
    moved = torch.cat([(state[k] - v).flatten() for k, v in start.items()])
    # (measured: largest 0.66 % of the largest move, norm 1.1e-4 of the move's, on AVX2)
    assert float(diff.abs().max()) < 0.02 * float(moved.abs().max())
    assert float(diff.norm()) < 1e-3 * float(moved.norm())
    assert not two.training


def test_a_batch_that_does_not_split_is_refused(setup) -> None:
    spec, processor, fresh = setup
    with pytest.raises(InputError, match="batch size 4 does not split over 3 ranks"):
        train_target(fresh(), Encoder(processor), spec.train, data_seed=0, world=World(0, 3))


def test_a_rank_that_fails_ends_the_build_with_its_error(setup) -> None:
    spec, _, fresh = setup
    with pytest.raises(InputError, match="does not split over 3 ranks"):
        train_on_ranks(fresh(), spec.train, ranks=3, threads_per_rank=1, data_seed=0)


def test_the_shipped_variants_split_their_batches() -> None:
    for variant in VARIANTS.values():
        for cfg in (variant.train, variant.finetune):
            if cfg is not None:
                assert cfg.batch_size % variant.build_ranks == 0, variant.name


def test_a_caller_script_without_a_main_guard_is_not_re_run(tmp_path) -> None:
    """The ranks are started as ``python -m``, not by multiprocessing's spawn, which would
    re-import the calling script (and here build again, under the cache's lock)."""
    import subprocess
    import sys

    script = tmp_path / "caller.py"
    script.write_text(
        "from dataclasses import replace\n"
        "import torch\n"
        "from dreams_nas.supernet.builtin.build import build_config, build_processor\n"
        "from dreams_nas.supernet.builtin.parallel import train_on_ranks\n"
        "from dreams_nas.supernet.builtin.variants import get_variant\n"
        "from transformers import LlavaForConditionalGeneration\n"
        "spec = get_variant('tiny')\n"
        "config = build_config(replace(spec, text_layers=1), build_processor().tokenizer)\n"
        "print('caller ran', flush=True)\n"
        "model = LlavaForConditionalGeneration(config)\n"
        "cfg = replace(spec.train, max_steps=2, eval_every=2)\n"
        "out = train_on_ranks(model, cfg, ranks=2, threads_per_rank=1, data_seed=0)\n"
        "print('steps', out['steps'], flush=True)\n", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["caller", "ran", "steps", "2"]
