"""benchmarks/bench_transfer.py: its run copies, the search's ranking, the table and its
refusals (the whole benchmark times full profiles: minutes, run by hand)."""

from __future__ import annotations

import json

import bench_transfer


def test_a_device_run_copies_the_supernet_and_rescore_another_dtype(tmp_path) -> None:
    base = tmp_path / "base"
    for name in ("supernet", "acceptance", "latency", "search"):
        (base / name).mkdir(parents=True)
        (base / name / "x").write_text(name)
    (base / "run.json").write_text(json.dumps({"dtype": "float32", "space": {}}))
    same = bench_transfer._copy_run(base, tmp_path / "same", "float32")
    assert sorted(p.name for p in same.iterdir()) == ["acceptance", "run.json", "supernet"]
    other = bench_transfer._copy_run(base, tmp_path / "bf16", "bfloat16")
    assert json.loads((other / "run.json").read_text())["dtype"] == "bfloat16"
    assert not (other / "acceptance").exists()  # scored again in its own dtype
    assert bench_transfer._device("2t-bfloat16") == (2, "bfloat16")


def test_the_speedup_ranking_and_the_table(tmp_path) -> None:
    for run, speedups in (("a", (1.0, 2.0, 3.0)), ("b", (1.5, 2.5, 2.0))):
        folder = tmp_path / run / "search" / "hw"
        folder.mkdir(parents=True)
        (folder / "trials.csv").write_text("spec_id,speedup\n" + "".join(
            f"s{i},{v}\n" for i, v in enumerate(speedups)))
    assert bench_transfer._speedup_tau(tmp_path / "a", tmp_path / "b", "hw") == 0.3333
    same = {"mape": 0.05, "tau": 0.9, "draft_tau": 0.5, "levels": "global"}
    result = {
        "full": {"2t": {"profile": {"wall_s": 100.0}, "search": {"pick": "p"}}},
        "transfers": [
            {"source": "1t", "target": "2t", "n": 5, "profile": {"code": 0, "wall_s": 5.0},
             "accuracy": {"mape": 0.08, "within_10pct": 0.6, "kendall_tau": 0.85,
                          "draft_tau": 0.5, "levels": {"same_session": same},
                          "vs_predictor": {"mape": 0.04, "tau": 0.93, "draft_tau": 0.9}},
             "search": {"pick": "q"}, "speedup_tau": 0.8},
            {"source": "1t-bfloat16", "target": "2t", "n": 5,
             "profile": {"code": 2, "error": "dreams-nas profile: error: ... dtype ..."}}],
        "measured": {"2t": {"p": {"speedup": 2.0}, "q": {"speedup": 1.9}}}}
    lines = bench_transfer.table(result)
    assert "| 1t -> 2t | 5 | 0.050 | 8.0 % (5.0 %) | 60 % | 0.850 (0.900) | 0.930 |" in lines[2]
    assert lines[2].endswith("`q` | 0.950 |")
    assert "refused" in lines[3] and lines[3].count("|") == lines[2].count("|")


def test_a_base_without_a_trained_supernet_is_refused(tmp_path, capsys) -> None:
    code = bench_transfer.main(["--base", str(tmp_path), "--work", str(tmp_path / "w"),
                                "--device", "1t-float32"])
    assert code == 2 and "not a trained and scored run folder" in capsys.readouterr().err
