"""`dreams-nas report`: writes the page, prints the summary, fails in one line without a search."""

from __future__ import annotations

import json

from dreams_nas.nas import cli

from .fixtures import CPU, Space, make_run

SMALL = Space(heads=(2, 4), visual_keep=(0.5, 1.0), inject_layer=(8, 12), draft_len=(3, 5))


def test_report_command_writes_page_and_json_summary(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", space=SMALL, aifd=False, predictor=False)
    out = tmp_path / "site" / "index.html"
    assert cli.main(["report", "--run", str(run), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    best = json.loads((run / "search" / CPU.hardware_id / "best.json").read_text())
    assert summary["report"] == str(out) and out.is_file()
    assert summary["best"] == best["spec_id"]
    assert summary["hardware_id"] == CPU.hardware_id
    assert "pareto_latency.svg" in summary["figures"]
    assert (tmp_path / "site" / "index_figures" / "pareto_latency.png").is_file()
    assert not (run / "report.html").exists()


def test_missing_search_results_is_one_line_exit_2(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    (run / "latency").mkdir(parents=True)
    assert cli.main(["report", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dreams-nas report: error: no search results in ")
    assert "trials.csv" in err and "run `dreams-nas search` first" in err


def test_bad_out_and_unknown_hardware_are_input_errors(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", space=SMALL)
    assert cli.main(["report", "--run", str(run), "--out", str(tmp_path / "r.txt")]) == 2
    assert "must end in .html" in capsys.readouterr().err
    assert cli.main(["report", "--run", str(run), "--hardware", "tpu-v9"]) == 2
    assert f"searched: {CPU.hardware_id}" in capsys.readouterr().err


def test_help_imports_no_matplotlib() -> None:
    import subprocess
    import sys

    code = ("import sys; from dreams_nas.nas import cli; rc = cli.main(['report', '--help']); "
            "print(rc, 'matplotlib' in sys.modules, 'dreams_nas.reports' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 False False"


def test_a_damaged_search_file_is_one_line_exit_2(tmp_path, capsys) -> None:
    """A trials.csv cut mid-row, or a pareto.csv that is not its front, exited 0 with a report of
    other subnets or another front (issue #48)."""
    run = make_run(tmp_path / "run", space=SMALL, aifd=False, predictor=False)
    search = run / "search" / CPU.hardware_id
    for name, cut in (("trials.csv", 7), ("pareto.csv", 0)):
        data = (search / name).read_bytes()
        lines = data.splitlines(keepends=True)
        (search / name).write_bytes(data[:-cut] if cut else b"".join(lines[:-1]))
        assert cli.main(["report", "--run", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("dreams-nas report: error: ")
        assert name in err and "rerun `dreams-nas search`" in err
        (search / name).write_bytes(data)
    assert not (run / "report.html").exists()
