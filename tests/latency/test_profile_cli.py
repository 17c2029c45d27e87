from __future__ import annotations

import json
import logging
import sys
from dataclasses import replace

import pytest
from _support.kill import kill_after_rows
from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.plan import StepKey
from dreams_nas.latency.measure.profile_store import ProfileStore, make_row
from dreams_nas.latency.measure.timing import Timing
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.nas import cli

FAST = ["--device", "cpu", "--threads", "1", "--repeats", "2", "--context-lengths", "12", "36"]
# its plan: 2 heads x 2 keeps x 2 contexts drafts (hot and after a verify), 2 decode, 2 x 7 verify,
# 2 x 3 cycles (one per draft_len of the space)
FAST_ROWS = 2 * 8 + 2 + 14 + 2 * 3


@pytest.fixture(autouse=True)
def quick_fits():
    """These tests check the profile command's plumbing, not which regressor the predictor's
    cross-validation picks: the in-process fits use small ensembles (`_support.fits`). The real
    candidates are tested in test_predictor.py."""
    from _support.fits import quick_latency_fits

    with quick_latency_fits():
        yield


def _profile_dir(run):
    (hw,) = run.hardware_ids()
    return run.latency_dir(hw), ProfileStore(run.profile_csv(hw))


def test_profile_writes_profile_and_predictor(small_run, tiny_llava, capsys) -> None:
    profile = ["profile", "--run", str(small_run.root), "--target", tiny_llava, "--json", *FAST]
    code = cli.main(profile)
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"mape", "rmse", "within_10pct", "kendall_tau"} <= set(summary)
    # per kind too: the held-out draft points (two contexts leave no target step to hold out)
    assert set(summary["by_kind"]) == {"draft", "draft_first"}
    for m in summary["by_kind"].values():
        assert set(m) == {"mape", "rmse", "within_10pct", "kendall_tau", "n"} and m["n"] >= 1
    assert summary["context_range"] == [12, 36]
    folder, store = _profile_dir(small_run)
    rows = store.read()
    assert len(rows) == summary["rows"] == summary["measured"] == FAST_ROWS
    assert set(rows.status) == {"ok"} and (rows.median_ms > 0).all()
    assert sorted(set(rows.heads[rows.kind == "draft"])) == [1, 4]
    first = rows[rows.kind == "draft_first"]
    assert sorted(first.spec_id) == sorted(rows.spec_id[rows.kind == "draft"])
    assert (first.k == 1).all()
    hw = json.loads((folder / "hardware.json").read_text())
    assert hw["kind"] == "cpu" and hw["threads"] == 1 and hw["hardware_id"].endswith("-1t")
    doc = json.loads((folder / "predictor.json").read_text())
    assert doc["hardware_id"] == hw["hardware_id"]
    assert doc["regressors"]["draft"] in doc["cv_scores"]["draft"]
    assert doc["regressors"]["verify"] in ("interpolated", "surface")
    assert set(doc["cv_scores"]["verify"]) == {"interpolated", "surface"}
    assert {k: m["n"] for k, m in doc["metrics_by_kind"].items()} == {
        k: m["n"] for k, m in summary["by_kind"].items()}
    assert LatencyPredictor.load(folder).target_ms("decode", [1], 20)[0] > 0
    run_json = small_run.read_run()
    assert run_json["target"]["family"] == "llava" and run_json["target"]["num_layers"] == 2
    # A rerun times nothing new; --fit-only refits from the profile alone.
    assert cli.main(profile) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["measured"] == 0 and again["resumed"] == again["rows"] == FAST_ROWS
    assert cli.main(["profile", "--run", str(small_run.root), "--fit-only", "--json", *FAST]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == FAST_ROWS
    # the same profile cannot grow rows timed with another clock
    assert cli.main(["profile", "--run", str(small_run.root), "--target", tiny_llava,
                     "--clock", "cpu", *FAST]) == 2
    assert "was timed with --clock wall, this run asks for --clock cpu" in capsys.readouterr().err
    # --fit-only with another thread count names what is profiled (2: a count any machine
    # that runs the tests has, since --threads above the logical cores is refused first)
    assert cli.main(["profile", "--run", str(small_run.root), "--fit-only", "--threads", "2"]) == 2
    assert f"profiled in this run: {hw['hardware_id']}" in capsys.readouterr().err
    # rows timed on another software stack are another machine's: refused, not merged
    (folder / "hardware.json").write_text(json.dumps({**hw, "torch": "1.13.1"}))
    before = store.path.read_text()
    assert cli.main(["profile", "--run", str(small_run.root), "--target", tiny_llava,
                     *FAST]) == 2
    err = capsys.readouterr().err
    assert "was timed with torch 1.13.1, this machine has" in err and "move" in err
    assert len(err.strip().splitlines()) == 1 and store.path.read_text() == before
    # ... and so are rows of another target architecture
    (folder / "hardware.json").write_text(json.dumps(hw))
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["architecture_hash"] == run_json["target"]["architecture_hash"]
    assert doc["fingerprint"]["architecture_hash"] == plan["architecture_hash"]
    (folder / "plan.json").write_text(json.dumps({**plan, "architecture_hash": "0" * 16}))
    assert cli.main(["profile", "--run", str(small_run.root), "--target", tiny_llava,
                     *FAST]) == 2
    err = capsys.readouterr().err
    assert f"timed a target of architecture {'0' * 16}" in err
    assert len(err.strip().splitlines()) == 1 and store.path.read_text() == before


class _Logged(list):
    """The messages the `dreams_nas` loggers emit at INFO and above once `listen` was called
    (the CLI replaces the logger's handlers and level: listen again after it)."""

    def __init__(self) -> None:
        super().__init__()
        self.handler = logging.Handler(logging.INFO)
        self.handler.emit = lambda record: self.append(record.getMessage())

    def listen(self) -> None:
        logger = logging.getLogger("dreams_nas")
        if self.handler not in logger.handlers:
            logger.addHandler(self.handler)
        logger.setLevel(logging.INFO)


@pytest.fixture
def logged():
    collected = _Logged()
    logger = logging.getLogger("dreams_nas")
    level = logger.level
    yield collected
    logger.removeHandler(collected.handler)
    logger.setLevel(level)


def test_repeats_bound_the_samples_and_a_partial_fit_is_told(small_run, tiny_llava, capsys,
                                                             logged) -> None:
    """--repeats is "at most": with the default 10 passes, 2 repeats took 10 samples a step.
    A torn last line was skipped and --fit-only fitted the rest without a word."""
    from dreams_nas.nas.stages.profile import ProfileOptions
    from dreams_nas.nas.stages.profile_reuse import completed_profile

    argv = ["profile", "--run", str(small_run.root), "--target", tiny_llava, "--device", "cpu",
            "--threads", "1", "--repeats", "2", "--context-lengths", "12", "--json", "-q"]
    assert cli.main(argv) == 0
    # 2 x 4 drafts, decode, 7 verify, 3 cycles (one per draft_len)
    assert json.loads(capsys.readouterr().out)["rows"] == 19
    folder, store = _profile_dir(small_run)
    rows = store.read()
    assert set(rows["n_samples"]) == {2}
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["passes"] == 2 and plan["warmup"] == 3

    # the demo's reuse check says which setting differs
    logged.listen()
    same = ProfileOptions(target=tiny_llava, device="cpu", threads=1, repeats=2,
                          context_lengths=[12], stat="p10_ms")
    assert completed_profile(small_run, same) is not None
    assert completed_profile(small_run, replace(same, repeats=3)) is None
    assert logged[-1] == "profile: redone (repeats 2 -> 3; passes 2 -> 3)"
    assert completed_profile(small_run, replace(same, context_lengths=[12, 20], seed=1)) is None
    assert logged[-1] == "profile: redone (seed 0 -> 1; context_lengths [12] -> [12 20])"
    assert completed_profile(small_run, replace(same, stat="median_ms")) is None
    assert logged[-1] == "profile: redone (stat p10_ms -> median_ms)"
    assert completed_profile(small_run, replace(same, warmup=1)) is None
    assert logged[-1] == "profile: redone (warmup 3 -> 1)"
    # a predictor this dreams-nas refuses to load is fitted again (nothing timed anew)
    report = json.loads((folder / "predictor.json").read_text())
    (folder / "predictor.json").write_text(json.dumps({**report, "schema_version": 8}))
    assert completed_profile(small_run, same) is None
    assert logged[-1] == "profile: redone (predictor schema 8 -> 9)"
    (folder / "predictor.json").write_text(json.dumps(report))
    # a plan that does not record its warm-ups is redone: nothing is assumed of an older plan
    (folder / "plan.json").write_text(json.dumps({k: v for k, v in plan.items()
                                                  if k != "warmup"}))
    assert completed_profile(small_run, same) is None
    assert logged[-1] == "profile: redone (warmup none -> 3)"
    (folder / "plan.json").write_text(json.dumps(plan))

    # a kill tore the last row: --fit-only fits the others and says so
    raw = store.path.read_bytes()
    store.path.write_bytes(raw[: raw.rstrip(b"\n").rfind(b"\n") + 20])
    assert cli.main(["profile", "--run", str(small_run.root), "--device", "cpu", "--threads",
                     "1", "--fit-only", "--json", "-q"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["rows"] == 18
    assert ("warning: fitted 18 of 19 planned steps; rerun `dreams-nas profile` without "
            "--fit-only to time the missing ones") in err
    logged.listen()
    assert completed_profile(small_run, same) is None
    assert logged[-1] == "profile: redone (1 of 19 planned steps not timed yet)"


@pytest.mark.parametrize("contexts, message", [
    (["12", "100000"], "--context-lengths 100000 exceed what the target holds: "
                       "max_position_embeddings 1024, less the 8 positions a verify step adds; "
                       "give lengths up to 1016"),
    (["3", "12"], "--context-lengths 3 leave no text after the 4 visual tokens of one image; "
                  "give lengths above 4"),
])
def test_context_lengths_the_target_cannot_hold_are_refused_first(
        small_run, tiny_llava, capsys, contexts, message) -> None:
    """100000 tokens spent minutes in allocation failures before the profile gave up."""
    before = small_run.run_json.read_text()
    assert cli.main(["profile", "--run", str(small_run.root), "--target", tiny_llava,
                     "--device", "cpu", "--threads", "1", "--repeats", "2",
                     "--context-lengths", *contexts, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"dreams-nas profile: error: {message}" in err
    assert not list(small_run.root.rglob("profile.csv"))
    assert not list(small_run.root.rglob("plan.json"))
    assert small_run.run_json.read_text() == before


def test_unknown_device_is_a_one_line_error(small_run, capsys) -> None:
    assert cli.main(["profile", "--run", str(small_run.root), "--device", "cuda:3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--device cuda:3 does not exist on this machine; the devices here are: cpu" in err


def test_bad_inputs(small_run, tiny_llava, tmp_path, capsys) -> None:
    base = ["profile", "--run", str(small_run.root)]
    assert cli.main([*base, "--target", str(tmp_path), *FAST]) == 2
    assert "holds no config.json, so it is not a Hugging Face checkpoint" in capsys.readouterr().err
    assert cli.main([*base, "--fit-only", *FAST]) == 2
    assert "no latency profile in" in capsys.readouterr().err
    assert cli.main([*base, "--target", tiny_llava, "--clock", "cpu", "--device", "cpu"]) == 2
    assert "--clock cpu (thread CPU time) is for the CPU with one thread" in capsys.readouterr().err
    assert cli.main([*base, "--target", tiny_llava, *FAST, "--budget", "lots"]) == 2
    assert "--budget 'lots' is not a number" in capsys.readouterr().err


def test_corrupt_profile_names_file_and_line(small_run, capsys) -> None:
    hw = detect_hardware("cpu", threads=1)
    store = ProfileStore(small_run.profile_csv(hw.hardware_id))
    timing = Timing(samples_ms=(1.0, 1.1), warmup=0, throttled=False)
    store.append([make_row(hw, StepKey("verify", 20, k), timing) for k in range(2, 9)])
    lines = store.path.read_text().splitlines()
    lines[4] = lines[4].replace(",ok,", ",fine,")
    store.path.write_text("\n".join(lines) + "\n")
    assert cli.main(["profile", "--run", str(small_run.root), "--fit-only", *FAST]) == 2
    assert f"{store.path}, line 5: status 'fine' is not one of" in capsys.readouterr().err


def test_a_duplicated_key_is_refused_by_fit_only(small_run, capsys) -> None:
    """A key recorded twice (the second timed 3x slower) was fitted, moving the prediction;
    now --fit-only exits 2 in one line naming the file, the key and the fix (issue #48)."""
    hw = detect_hardware("cpu", threads=1)
    store = ProfileStore(small_run.profile_csv(hw.hardware_id))
    store.append([make_row(hw, StepKey("verify", 20, k),
                           Timing(samples_ms=(1.0 + k, 1.1 + k), warmup=0, throttled=False))
                  for k in range(2, 9)])
    lines = store.path.read_text().splitlines(keepends=True)
    slower = lines[3].replace(",5.05,", ",15.15,", 1)  # k 4, median 5.05 ms
    assert slower != lines[3]
    store.path.write_text("".join(lines) + slower)
    assert cli.main(["profile", "--run", str(small_run.root), "--fit-only", *FAST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dreams-nas profile: error: ")
    assert (f"{store.path}, line 9: key ['verify', '', 20, 4] (kind, spec_id, context_len, k) "
            "was recorded already on line 4") in err and "delete that line" in err
    assert not (store.path.parent / "predictor.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_killed_profile_resumes_without_duplicate_or_missing_rows(small_run, tiny_llava,
                                                                  capsys, batch) -> None:
    """Batch 1, and a batched profile (`--batch-sizes 2`: its own hardware id)."""
    argv = [sys.executable, "-m", "dreams_nas.nas.cli", "profile", "--run", str(small_run.root),
            "--target", tiny_llava, "-q", "--device", "cpu", "--threads", "1", "--repeats", "10",
            "--context-lengths", "12", "20", "36", "--holdout", "0.3", "--passes", "1",
            "--batch-sizes", str(batch)]
    csv = kill_after_rows(argv, small_run)
    assert small_run.hardware_ids()[0].endswith("-b2") == (batch == 2)
    store = ProfileStore(csv)
    partial = len(store.read())
    # drafts hot and after a verify, decode, verify, a cycle per draft_len
    total = 2 * (2 * 2 * 3) + 3 + 3 * 7 + 3 * 3
    assert 5 <= partial < total
    # the resume runs in-process: a second interpreter would import torch again and fit
    # with the real regressors, and neither is what this test is about
    assert cli.main([*argv[3:], "--json", "--holdout", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = store.read()
    keys = list(zip(rows.kind, rows.spec_id, rows.context_len, rows.k, strict=True))
    assert len(keys) == len(set(keys)) == total  # nothing twice, nothing missing
    assert summary["resumed"] == partial and summary["measured"] == total - partial


@pytest.mark.cuda
def test_profile_on_the_gpu(small_run, tiny_llava, capsys) -> None:
    argv = ["profile", "--run", str(small_run.root), "--target", tiny_llava, "--json",
            "--device", "cuda:0", "--repeats", "5", "--context-lengths", "12", "36"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    folder, store = _profile_dir(small_run)
    hw = json.loads((folder / "hardware.json").read_text())
    assert hw["kind"] == "cuda" and hw["dtype"] == "bfloat16"
    assert summary["hardware_id"] == hw["hardware_id"]
    rows = store.read()
    assert len(rows) == FAST_ROWS and set(rows.status) == {"ok"}
    assert set(rows.clock) == {"cuda-events"}


def test_profile_spans_the_evaluation_prompts_by_default(small_run, tmp_path, capsys) -> None:
    """Without --context-lengths the grid runs from the shortest evaluation prompt to the
    longest plus an answer, and the visual-token feature is their median (nas/stages/contexts),
    read through the checkpoint's own processor."""
    from _support.models import save_tiny_vlm

    target = str(save_tiny_vlm("llava", tmp_path / "llava"))
    code = cli.main(["profile", "--run", str(small_run.root), "--target", target, "--json",
                     "--device", "cpu", "--threads", "1", "--repeats", "1", "--limit", "1",
                     "--max-new-tokens", "1", "--budget", "4"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    (hw,) = small_run.hardware_ids()
    plan = json.loads((small_run.latency_dir(hw) / "plan.json").read_text())
    data = plan["data_contexts"]
    assert data["data"] == "builtin" and data["n_prompts"] == 1  # one prompt: a short grid
    assert data["max_new_tokens"] == 1
    low, high = data["span"]
    assert low == data["prompt_len"]["min"] and high == data["prompt_len"]["max"] + 1
    assert plan["context_lengths"][0] == low and plan["context_lengths"][-1] == high
    assert plan["visual_tokens"] == data["visual_tokens"]["median"] > 0
    assert summary["context_range"] == [low, high]


def test_compiled_steps_need_a_warmup(tmp_path, capsys) -> None:
    """A compiled step's first call compiles it: with --warmup 0 a sample would hold that."""
    from dreams_nas.nas import cli

    code = cli.main(["profile", "--run", str(tmp_path / "run"), "--device", "cpu",
                     "--compile", "on", "--warmup", "0", "--json"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--warmup 0 with compiled steps" in err and "--warmup 1 or more" in err
