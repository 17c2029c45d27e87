"""`dreams-nas demo` end to end and the user's own commands in an empty folder, on the tiny
built-in target (DREAMS_NAS_DEMO_VARIANT=tiny) with every stage shrunk to test size."""

from __future__ import annotations

import json

import pytest
from _support.demo import DEMO_ARGS
from dreams_nas.nas import cli
from dreams_nas.supernet.core.runfolder import RunFolder

pytestmark = pytest.mark.slow  # builds the tiny built-in target once, trains two tiny supernets

# The real pipeline, every stage at test size.
TRAIN = ["--train-prompts", "3", "--train-steps", "1"]
# two contexts around the search's (a search outside the profiled ones is refused)
PROFILE = ["--repeats", "2", "--context-lengths", "40", "64", "--threads", "1"]
EVAL = ["--limit", "2", "--max-new-tokens", "5", "--verify-prompts", "1"]


@pytest.fixture
def cache(builtin_cache):
    """The session's cache holding the tiny built-in target (tests/conftest.py)."""
    return builtin_cache


@pytest.fixture
def cmd(cache, monkeypatch, capsys):
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(cache))
    monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")

    def call(*argv, quiet=True):
        code = cli.main([*argv, "--json", *(["-q"] if quiet else [])])
        out, err = capsys.readouterr()
        return code, (json.loads(out) if code == 0 else None), err

    return call


def _counts(run: RunFolder, hardware_id: str) -> tuple[int, int]:
    profile = run.profile_csv(hardware_id).read_text().count("\n")
    acceptance = sum(p.read_text().count("\n") for p in (run.root / "acceptance").glob("*.csv"))
    return profile, acceptance


def test_demo_runs_the_pipeline_then_reuses_every_artefact(tiny_demo, cmd, tmp_path) -> None:
    # The first demo is the session's `tiny_demo`: `argv` on an empty folder, in this cache.
    argv = ["demo", "--run", str(tmp_path / "run"), *DEMO_ARGS]
    assert argv[3:] == ["--device", "cpu", "--profile-budget", "4", *TRAIN, *PROFILE, *EVAL]
    first, built = tiny_demo.summary, RunFolder(tiny_demo.root)
    assert first["stages"] == {"target": "reused", "train": "done", "profile": "done",
                               "score": "done", "search": "done", "report": "done"}
    hw = first["hardware_id"]
    assert (built.root / "report.html").is_file() and first["report"] == str(built.report_html)
    best = json.loads(built.best_json(hw).read_text())
    assert best["spec_id"] == first["best"] and best["objective"] == "speedup"
    # the best subnet's steps were timed again before its one prompt and after it (`retime`)
    from dreams_nas.supernet.core.spec import SubnetSpec

    retimed = best["measured"].get("retimed")
    if SubnetSpec.from_id(best["spec_id"]).is_tree:
        assert retimed is None  # chains only
    else:
        assert set(retimed["ms"]) == {"decode_ms", "verify_ms", "draft_ms", "first_draft_ms",
                                      "cycle_overhead_ms"}
        assert set(retimed["drift_pct"]) == set(retimed["ms"])  # the profile priced the cycle
        assert retimed["samples"] == 4 and retimed["speedup"] > 0
        assert retimed["gap_pct"] == pytest.approx(
            (best["measured"]["speedup"] / retimed["speedup"] - 1) * 100)
    assert (built.spec_dir(first["best"]) / "spec.json").is_file()
    assert first["measured_speedup"] == pytest.approx(best["measured"]["speedup"], abs=1e-4)
    assert first["predicted_speedup"] == pytest.approx(best["predicted"]["speedup"], abs=1e-4)
    assert first["predicted_tau"] > 0 and first["measured_tau"] >= 1

    # ... rerun on a copy of its folder
    run = RunFolder(tiny_demo.copy(tmp_path / "run"))
    weights = run.supernet_dir / "model.safetensors"
    stamps = {p: p.stat().st_mtime_ns for p in (weights, run.best_json(hw), run.report_html,
                                                run.predictor_json(hw))}
    counts = _counts(run, hw)
    code, second, err = cmd(*argv)
    assert code == 0, err
    assert set(second["stages"].values()) == {"reused"}
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing retrained or rewritten
    assert _counts(run, hw) == counts
    assert (second["best"], second["measured_speedup"], second["report"]) == (
        first["best"], first["measured_speedup"], str(run.report_html))

    # a changed stage setting redoes that stage only (the profile resumes its rows)
    code, third, err = cmd(*[a if a != "4" else "6" for a in argv])
    assert code == 0, err
    assert third["stages"]["profile"] == "done" and third["stages"]["train"] == "reused"
    assert _counts(run, hw)[0] > counts[0]


def test_demo_redoes_the_search_when_its_data_change(tiny_demo, cmd, tmp_path) -> None:
    """best.json was reused whenever it was newer than its input files: back to another
    --max-new-tokens (or --limit) whose rows were cached, the demo answered with the search of
    the previous settings."""
    run = RunFolder(tiny_demo.copy(tmp_path / "run"))  # the demo("2", "5") below, done
    # no report: this test is about the search's reuse (each redone search would redraw it)
    base = ["demo", "--run", str(run.root), "--device", "cpu", "--profile-budget", "4",
            *TRAIN, *PROFILE, "--verify-prompts", "1", "--no-report"]

    def demo(limit: str, tokens: str) -> tuple[dict, str]:
        code, summary, err = cmd(*base, "--limit", limit, "--max-new-tokens", tokens,
                                 quiet=False)
        assert code == 0, err
        return summary, err

    first, _ = demo("2", "5")
    best = json.loads(run.best_json(first["hardware_id"]).read_text())
    assert best["inputs"]["max_new_tokens"] == 5 and best["inputs"]["limit"] == 2
    assert best["inputs"]["acceptance"] == "acceptance/builtin-eval-n2.csv"
    longer, err = demo("2", "8")
    assert {k: longer["stages"][k] for k in ("train", "profile", "score", "search")} == {
        "train": "reused", "profile": "reused", "score": "done", "search": "done"}
    assert "search: redone (max_new_tokens 5 -> 8" in err
    assert "score: redone (" in err
    # the supernet stays (retraining would invalidate the run), with a warning saying so
    assert "warning: reusing the supernet" in err and "max_new_tokens 5 -> 8" in err
    assert f"`dreams-nas train --run {run.root} --target builtin --n-train 3" in err

    again, err = demo("2", "5")  # every row cached, best.json newer than every input file
    assert again["stages"]["score"] == "reused" and again["stages"]["search"] == "done"
    assert "search: redone (max_new_tokens 8 -> 5" in err
    keys = ("best", "predicted_speedup", "predicted_tau")
    assert {k: again[k] for k in keys} == {k: first[k] for k in keys}  # the 5-token answer

    more, err = demo("3", "5")
    assert more["stages"]["score"] == "done" and more["stages"]["search"] == "done"
    assert "dataset_id builtin-eval-n2 -> builtin-eval-n3; limit 2 -> 3" in err
    _, err = demo("2", "5")
    assert "search: redone (" in err and "limit 3 -> 2" in err
    repeat, err = demo("2", "5")
    assert repeat["stages"].pop("report") == "skipped" and repeat["report"] is None
    assert set(repeat["stages"].values()) == {"reused"} and "redone" not in err


def test_demo_in_bfloat16_keeps_one_dtype_end_to_end(cmd, tmp_path) -> None:
    import pandas as pd
    from safetensors import safe_open

    run = RunFolder(tmp_path / "run")
    argv = ["demo", "--run", str(run.root), "--device", "cpu", "--dtype", "bfloat16",
            "--profile-budget", "4", *TRAIN, *PROFILE, *EVAL, "--no-report"]
    code, summary, err = cmd(*argv)
    assert code == 0, err
    hw = summary["hardware_id"]
    assert summary["dtype"] == run.read_run()["dtype"] == "bfloat16"
    best = json.loads(run.best_json(hw).read_text())
    assert best["dtype"] == best["measured"]["dtype"] == "bfloat16"
    measured = best["measured"]
    assert measured["prompts"] == 1 and 0 <= measured["identical_prompts"] <= 1
    assert len(measured["divergences"]) == measured["prompts"] - measured["identical_prompts"]
    spec_dir = run.spec_dir(best["spec_id"])
    assert json.loads((spec_dir / "spec.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(spec_dir / "draft.safetensors"), "pt") as draft:
        assert {str(draft.get_tensor(k).dtype) for k in draft.keys()} == {"torch.bfloat16"}
    assert set(pd.read_csv(run.profile_csv(hw))["dtype"]) == {"bfloat16"}
    (acceptance,) = (run.root / "acceptance").glob("*.csv")
    assert set(pd.read_csv(acceptance)["dtype"]) == {"bfloat16"}
    # a second command in another dtype is refused, naming both; nothing is written
    code, _, err = cmd("score", "--run", str(run.root), "--device", "cpu", "--dtype", "float32",
                       "--limit", "2")
    assert code == 2 and err.count("\n") == 1
    assert "--dtype float32 differs from this run's dtype bfloat16" in err
    # without --dtype every stage takes the run's dtype and reuses its work
    code, again, err = cmd(*[a for a in argv if a not in ("--dtype", "bfloat16")])
    assert code == 0, err
    assert set(again["stages"].values()) == {"reused", "skipped"}
    assert again["dtype"] == "bfloat16"


def test_demo_on_the_tiny_proxy_target_in_bfloat16(cmd, tmp_path) -> None:
    """`--target proxy-llava` runs the same pipeline on a real-shaped random-weight target
    (here its test-size twin: 64 visual tokens, a 1,000-token BPE), recorded by name."""
    run = RunFolder(tmp_path / "run")
    argv = ["demo", "--run", str(run.root), "--target", "proxy-llava-tiny", "--device", "cpu",
            "--dtype", "bfloat16", "--profile-budget", "4", *TRAIN, "--repeats", "2",
            "--context-lengths", "80", "120", "--threads", "1", *EVAL, "--no-report"]
    code, summary, err = cmd(*argv)
    assert code == 0, err
    assert summary["target_variant"] == "proxy-llava-tiny" and summary["dtype"] == "bfloat16"
    info = run.read_run()["target"]
    assert info["id"] == "proxy-llava-tiny" and run.target_source() == "proxy-llava-tiny"
    best = json.loads(run.best_json(summary["hardware_id"]).read_text())
    assert best["measured"]["prompts"] == 1 and best["dtype"] == "bfloat16"
    code, again, err = cmd(*argv)
    assert code == 0, err
    assert set(again["stages"].values()) == {"reused", "skipped"}
    # the built-in target's run folder is not the proxy's
    code, _, err = cmd("demo", "--run", str(run.root), "--device", "cpu", *TRAIN, *EVAL)
    assert code == 2 and "holds a supernet of target" in err


def test_demo_refuses_a_run_folder_of_another_target(cmd, tmp_path) -> None:
    from dreams_nas.nas.stages.train import TrainOptions, ensure_supernet
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.draft.saving import SUPERNET_WEIGHTS, file_hash

    run = RunFolder(tmp_path / "run")
    run.supernet_dir.mkdir(parents=True)
    (run.supernet_dir / SUPERNET_WEIGHTS).write_bytes(b"weights")
    run.update_run(target={"id": "/models/other", "path": "/models/other"},
                   supernet={"hash": file_hash(run.supernet_dir / SUPERNET_WEIGHTS)})
    with pytest.raises(InputError, match=r"holds a supernet of target /models/other, not of "):
        ensure_supernet(run, TrainOptions(), target_path="/cache/built-in target")


def test_profile_then_search_in_an_empty_folder(cmd, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, profiled, err = cmd("profile", "--device", "cpu", "--budget", "4", *PROFILE)
    assert code == 0, err
    run = RunFolder("dreams-run")
    assert not run.supernet_dir.exists()
    code, searched, err = cmd("search", "--objective", "speedup", *TRAIN, *EVAL, quiet=False)
    assert code == 0, err
    assert "no trained supernet in dreams-run/supernet: training one now" in err
    assert searched["hardware_id"] == profiled["hardware_id"]
    assert searched["n_scored"] == searched["space_size"]  # nothing was scored before
    assert (run.supernet_dir / "model.safetensors").is_file()
    assert run.best_json(profiled["hardware_id"]).is_file() and run.report_html.is_file()


@pytest.mark.parametrize("command", ["profile", "train", "score", "search", "generate", "demo"])
def test_missing_cuda_device_is_one_line(command, cmd, tmp_path, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    extra = ["--image", str(tmp_path / "x.png"), "--prompt", "hi"] if command == "generate" else []
    if command == "generate":
        from PIL import Image

        Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    code, _, err = cmd(command, "--device", "cuda:0", *extra)
    assert code == 2
    assert err.count("\n") == 1
    assert (f"dreams-nas {command}: error: --device cuda:0 does not exist on this machine; the "
            "devices here are: cpu (torch sees no CUDA device)") in err
    assert not (tmp_path / "dreams-run").exists()


def test_quiet_means_only_warnings_and_errors(tiny_demo, cache, monkeypatch, tmp_path,
                                               capsys) -> None:
    # the session's `tiny_demo` ran every stage in an empty folder with -q (and --json, which
    # changes stdout only)
    assert tiny_demo.summary["stages"]["train"] == "done"
    fresh = tiny_demo.stderr.splitlines()
    assert [line for line in fresh if not line.startswith("warning: ")] == []
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(cache))
    monkeypatch.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")
    run = tiny_demo.copy(tmp_path / "run")
    code = cli.main(["demo", "--run", str(run), "--device", "cpu", "--profile-budget", "4",
                     *TRAIN, *PROFILE, *EVAL, "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "best subnet" in out  # the command's answer is its output, on stdout
    assert [line for line in err.splitlines() if not line.startswith("warning: ")] == []
