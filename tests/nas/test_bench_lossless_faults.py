"""benchmarks/bench_lossless_faults.py on the tiny built-in target: every condition is decoded
and judged, and the clean loop is never refused (what the faults score is BENCHMARKS.md's)."""

from __future__ import annotations

import json

import bench_lossless_faults
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_condition_is_decoded_and_judged_and_the_clean_loop_passes(builtin_cache, capsys,
                                                                        monkeypatch) -> None:
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(builtin_cache))
    monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")
    assert bench_lossless_faults.main(["--prompts", "2", "--max-new-tokens", "12", "--dtype",
                                       "float32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["threads"], out["near_tie_ulps"], out["prompts"]) == (1, 256.0, 2)
    rows = {row["condition"]: row for row in out["conditions"]}
    assert list(rows) == list(bench_lossless_faults.CONDITIONS)
    for row in rows.values():
        assert row["identical"] + row["near_ties"] + row["caught"] >= row["prompts"] == 2
        assert len(row["drift_ulps"]) == 2
    assert rows["clean"]["caught"] == 0 and rows["clean"]["refused"] == []
