"""benchmarks/bench_draft_range.py: every subnet of the space's shapes is timed once a round and
the range is the slowest over the fastest (timings themselves are not asserted)."""

from __future__ import annotations

import json

import bench_draft_range
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert bench_draft_range.main(["--geometry", "builtin", "--context", "20", "--visual", "6",
                                   "--rounds", "1", "--repeats", "2", *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_every_subnet_of_the_shapes_is_timed_and_the_range_is_slowest_over_fastest(capsys):
    out = _run(capsys, "--depth", "2", "--mlp", "0.5,1")
    # heads 1-4 x visual_keep 0.25 / 1 x depth 1-2 x MLP 0.5 / 1; the demo's vocabulary is small
    assert len(out["ms"]) == 4 * 2 * 2 * 2
    assert not any("-n" in sid for sid in out["ms"])
    assert {"h1-v0.25-l8-m0.50-g1", "h4-v1.00-l8-d2-g1"} <= set(out["ms"])
    ms = out["ms"]
    assert out["fastest"] == [min(ms, key=ms.get), min(ms.values())]
    assert out["slowest"] == [max(ms, key=ms.get), max(ms.values())]
    assert out["range"] == pytest.approx(max(ms.values()) / min(ms.values()), rel=1e-2)


def test_draft_vocabularies_join_the_shapes(capsys):
    out = _run(capsys, "--depth", "1", "--mlp", "1", "--draft-vocab", "0.25,1")
    assert len(out["ms"]) == 4 * 2 * 2
    assert "h4-v1.00-l8-n0.25-g1" in out["ms"] and "h4-v1.00-l8-g1" in out["ms"]


def test_compiled_steps_are_timed_over_a_static_cache(capsys, monkeypatch):
    """--compile on: the loop's compiled step (dynamo's capture here, not inductor's code), one
    graph per shape; visual_keep changes no shape at this size (the memory is padded)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("DREAMS_NAS_COMPILE_BACKEND", "eager")
    before = counters["stats"]["unique_graphs"]
    out = _run(capsys, "--depth", "1", "--mlp", "1", "--compile", "on")
    assert out["compile"] == "on" and len(out["ms"]) == 4 * 2
    assert counters["stats"]["unique_graphs"] - before <= 4  # one per head count at most


def test_more_visual_tokens_than_positions_is_refused():
    with pytest.raises(SystemExit):
        bench_draft_range.main(["--context", "10", "--visual", "10"])
