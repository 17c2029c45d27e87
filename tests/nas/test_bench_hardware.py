"""benchmarks/bench_hardware.py: the cross-hardware table read off exhaustive searches."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import bench_hardware


def _run(root: Path, dtype: str, searches: dict[str, dict[str, float]]) -> Path:
    root.mkdir(parents=True)
    (root / "run.json").write_text(json.dumps({"schema_version": 2, "dtype": dtype}))
    for hw, speedups in searches.items():
        folder = root / "search" / hw
        folder.mkdir(parents=True)
        with (folder / "trials.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, ["spec_id", "speedup", "tau", "state"])
            writer.writeheader()
            for spec, speedup in speedups.items():
                writer.writerow({"spec_id": spec, "speedup": speedup, "tau": 4.0,
                                 "state": "COMPLETE"})
            writer.writerow({"spec_id": "h9-v1.00-l1-g9", "speedup": 9.0, "tau": 9.0,
                             "state": "FAIL"})  # not a complete trial: never a choice
    return root


def test_each_hardware_loses_by_another_ones_choice(tmp_path, capsys) -> None:
    fp32 = _run(tmp_path / "fp32", "float32",
                {"cpu-x-1t": {"a": 2.0, "b": 1.8}, "cpu-x-2t": {"a": 1.5, "b": 1.6}})
    bf16 = _run(tmp_path / "bf16", "bfloat16", {"cpu-x-2t": {"a": 1.2, "b": 1.0}})
    hardware = [*bench_hardware.load(fp32, 3), *bench_hardware.load(bf16)]
    assert "holds 2 of 3 subnets" in capsys.readouterr().err
    assert [(h.label, h.best) for h in hardware] == [
        ("cpu-x-1t float32", "a"), ("cpu-x-2t float32", "b"), ("cpu-x-2t bfloat16", "a")]
    lines = bench_hardware.cross_table(hardware)
    assert "| cpu-x-2t float32 | `b` | 1.600 | 4.000 |" in lines
    rows = {line.split(" | ")[0]: line for line in lines if "%" in line}
    assert "1.500 (-6.2 %)" in rows["| cpu-x-2t float32"]  # 1t's choice a on 2t: 1.5 / 1.6
    assert "1.800 (-10.0 %)" in rows["| cpu-x-1t float32"]
    assert rows["| cpu-x-2t bfloat16"].count("+0.0 %") == 2


def test_the_searchs_own_pick_breaks_a_tie(tmp_path) -> None:
    run = _run(tmp_path / "run", "float32", {"cpu-x-1t": {"h4-v1.00-l4-g7": 2.0,
                                                          "h4-v1.00-l8-g7": 2.0}})
    (run / "search" / "cpu-x-1t" / "best.json").write_text(
        json.dumps({"spec_id": "h4-v1.00-l4-g7"}))
    assert bench_hardware.load(run)[0].best == "h4-v1.00-l4-g7"
