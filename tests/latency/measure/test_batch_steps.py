"""The steps a profile times at batch B: the batched loop's own, every row at the key's
context, each step leaving the rows as it found them; built in any order."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.latency.measure.batch_steps import BatchModelSteps
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.steps import build_supernet
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.space import SearchSpace

SPACE = SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3))


@pytest.fixture(scope="module")
def steps(tiny_llava) -> BatchModelSteps:
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = TargetAdapter.load(tiny_llava, device="cpu", dtype=torch.float32)
    supernet = build_supernet(adapter.model, SPACE)
    return BatchModelSteps(adapter, supernet, visual_tokens=4, batch=3, precede=SPACE.largest())


def test_each_kind_runs_batched_and_leaves_the_rows_as_it_found_them(steps) -> None:
    """A cycle first (its rows filled inside inference mode), then steps built outside it at
    other contexts: every kind runs, on 3 rows, and the target's rows keep their length."""
    cycle = steps.build(StepKey("cycle", 20, 4))
    cycle.prepare()
    n, kept, table = cycle.run()
    assert kept.shape == (3, 4) and len(table) == 3 and cycle.excluded("wall") > 0
    spec = SPACE.largest()
    for key in (StepKey("decode", 12), StepKey("verify", 24, 4), StepKey("draft", 20, 1, spec),
                StepKey("draft_first", 12, 1, spec)):
        step = steps.build(key)
        for _ in range(2):
            if step.prepare is not None:
                step.prepare()
            out = step.run()
            assert out.shape[0] == 3, key
            if key.kind in ("decode", "verify"):
                assert steps.rows.lengths == [key.context_len] * 3
    with pytest.raises(InputError, match="not timed at batch 3"):
        steps.build(StepKey("verify_tree", 20, 4))
