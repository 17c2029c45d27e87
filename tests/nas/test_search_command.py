"""`dreams-nas score` and `dreams-nas search` on a real (tiny) trained run folder."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from _support import trained
from _support.search import this_cpu
from dreams_nas.nas import cli
from dreams_nas.supernet.core.runfolder import RunFolder

# slow: trains a tiny supernet once for the module (~10 s)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
HW = this_cpu()  # the search measures only on the profiled machine
SPACE = trained.SPACE


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny supernet trained once for the session, with a space and a synthetic latency fit."""
    return trained.trained_run(tmp_path_factory)


@pytest.fixture
def tiny_run(trained_run, tmp_path):
    """(run, examples): a fresh copy of the trained run folder for each test, so that no test
    sees the acceptance tables, studies or specs another test wrote."""
    run, examples = trained_run
    return RunFolder(shutil.copytree(run.root, tmp_path / "dreams-run")), examples


@pytest.fixture
def cmd(tiny_run, monkeypatch, capsys):
    run, examples = tiny_run
    monkeypatch.setattr("dreams_nas.nas.stages.inputs.load_eval_examples",
                        lambda data, limit, seed: examples[: limit or len(examples)])

    def call(*argv):
        code = cli.main([*argv, "--run", str(run.root), "--json", "-q"])
        out, err = capsys.readouterr()
        return code, (json.loads(out) if code == 0 else None), err

    return call


def test_score_then_search_writes_every_artefact(tiny_run, cmd) -> None:
    run, _ = tiny_run
    code, score, err = cmd("score", "--limit", "4", "--max-new-tokens", "12", "--device", "cpu")
    assert code == 0, err
    assert score["n_specs"] == SPACE.size and score["method"] == "teacher-forced"
    assert score["n_scored"] == SPACE.size and score["n_cached"] == 0
    code, again, _ = cmd("score", "--limit", "4", "--max-new-tokens", "12", "--device", "cpu")
    assert again["n_scored"] == 0  # all cached

    code, out, err = cmd("search", "--limit", "4", "--max-new-tokens", "12", "--device", "cpu",
                         "--verify", "2", "--verify-prompts", "2", "--objective", "pareto")
    assert code == 0, err
    assert out["n_scored"] == 0 and out["n_evaluations"] == SPACE.size
    best = json.loads(run.best_json(HW).read_text())
    assert best["spec_id"] == out["best"] and best["objective"] == "pareto"
    assert best["measured"]["speedup"] > 0 and best["predicted"]["speedup"] > 0
    assert out["measured"]["speedup"] == pytest.approx(best["measured"]["speedup"])
    assert len(best["verified"]) == min(2, len(set(out["front"]) | {out["best"]}))
    assert best["verified"][0]["spec_id"] == best["spec_id"]
    assert best["hardware"]["hardware_id"] == HW and best["supernet_hash"]
    # the gap between predicted and measured decode-phase speedup, stated once
    measured = best["measured"]
    assert measured["predicted_speedup"] == pytest.approx(best["predicted"]["speedup"])
    assert measured["gap_pct"] == pytest.approx(
        (measured["speedup"] / measured["predicted_speedup"] - 1) * 100)
    assert out["gap_pct"] == pytest.approx(measured["gap_pct"], abs=0.01)
    assert best["verified"][0]["gap_pct"] == pytest.approx(measured["gap_pct"])
    # each repeat's speedup beside their median, so an outlying pass shows
    repeats = measured["repeat_speedups"]
    assert len(repeats) == measured["repeats"] and best["verified"][0]["repeat_speedups"] == repeats
    if len(repeats) > 1:
        assert measured["speedup"] == pytest.approx(sorted(repeats)[len(repeats) // 2])
    # a profile made before the cycle kinds: the overhead is priced 0 ms, and said so once
    assert best["cycle_overhead"]["priced"] is False and out["cycle_overhead_priced"] is False
    note = best["cycle_overhead"]["note"]
    assert "no cycle rows" in note and "rerun `dreams-nas profile`" in note
    assert out["warnings"].count(note) == 1
    assert set(pd.read_csv(run.trials_csv(HW))["cycle_overhead_ms"]) == {0.0}
    spec_dir = run.root / best["spec_dir"]
    assert {"spec.json", "config.json", "draft.safetensors"} <= {p.name for p in spec_dir.iterdir()}
    trials = pd.read_csv(run.trials_csv(HW))
    assert len(trials) == SPACE.size and set(trials["method"]) == {"exhaustive"}
    assert len(pd.read_csv(run.pareto_csv(HW))) == len(out["front"])

    # the exported spec folder decodes with the engine, losslessly
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.decoding.registry import load_drafter
    from dreams_nas.supernet.target.adapter import TargetAdapter

    target = TargetAdapter.load(json.loads(run.run_json.read_text())["target"]["path"])
    inputs = target.build_inputs(tiny_run[1][0].image_path, tiny_run[1][0].prompt)
    drafter = load_drafter(spec_dir, target)
    spec = json.loads((spec_dir / "spec.json").read_text())["spec"]
    fast = generate(target, inputs, drafter, shape=spec["draft_len"], max_new_tokens=12)
    assert fast.tokens.tolist() == plain_generate(target, inputs, max_new_tokens=12).tokens.tolist()


def test_optuna_search_resumes_in_the_run_folder(tiny_run, cmd) -> None:
    run, _ = tiny_run
    args = ("search", "--method", "optuna", "--trials", "5", "--limit", "4",
            "--max-new-tokens", "12", "--device", "cpu", "--verify", "0")
    code, first, err = cmd(*args)
    assert code == 0, err
    assert first["n_evaluations"] == 5 and run.study_db(HW).is_file()
    code, second, _ = cmd(*args[:4], "8", *args[5:])
    assert second["n_evaluations"] == 8 and second["study_name"] == first["study_name"]
    assert len(pd.read_csv(run.search_dir(HW) / "history.csv")) == 8


def test_unprofiled_hardware_lists_the_profiled_ones(cmd) -> None:
    code, _, err = cmd("search", "--hardware", "nvidia-h100", "--verify", "0")
    assert code == 2
    assert err.count("\n") == 1
    assert "'nvidia-h100' has no latency profile" in err and HW in err


def test_spec_outside_the_space_is_one_line(tiny_run, cmd, tmp_path) -> None:
    specs = tmp_path / "specs.txt"
    specs.write_text("h4-v0.50-l1-g3\nh3-v0.50-l1-g3\n")
    code, _, err = cmd("score", "--specs", str(specs), "--limit", "4")
    assert code == 2 and err.count("\n") == 1
    assert "The value 3 of field 'heads'" in err and "allowed: [2, 4]" in err


def test_acceptance_of_another_supernet_is_refused(tiny_run, cmd) -> None:
    run, _ = tiny_run
    path = run.acceptance_csv("builtin-eval-n3")
    path.parent.mkdir(parents=True, exist_ok=True)
    from dreams_nas.supernet.acceptance.table import ACCEPTANCE_COLUMNS

    row = dict.fromkeys(ACCEPTANCE_COLUMNS, "")
    row.update(supernet_hash="0123456789abcdef", dataset_id="builtin-eval-n3",
               spec_id="h2-v0.50-l1-g1", heads=2, visual_keep=0.5, inject_layer=1, draft_len=1,
               temperature=0.0, method="teacher-forced", tau=1.5, tau_lo=1.4, tau_hi=1.6)
    pd.DataFrame([row]).to_csv(path, index=False)
    code, _, err = cmd("search", "--limit", "3", "--verify", "0")
    assert code == 2 and err.count("\n") == 1
    assert "scored with supernet 0123456789abcdef" in err and "move the file aside" in err


def test_the_search_keeps_its_results_when_the_measurement_fails(tiny_run, cmd,
                                                                 monkeypatch) -> None:
    run, _ = tiny_run

    def broken(*args, **kwargs):
        raise RuntimeError("the measurement broke")

    monkeypatch.setattr("dreams_nas.nas.stages.verify.measure_end_to_end", broken)
    code, _, err = cmd("search", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu",
                       "--verify", "1", "--verify-prompts", "1")
    assert code == 1 and "the measurement broke" in err
    best = json.loads(run.best_json(HW).read_text())
    assert best["measured"] is None and best["predicted"]["speedup"] > 0
    assert (run.root / best["spec_dir"] / "draft.safetensors").is_file()
    assert len(pd.read_csv(run.trials_csv(HW))) == SPACE.size


@pytest.mark.parametrize("lossless", [True, False])
def test_the_verification_records_near_ties_and_stops_at_a_loss(tiny_run, cmd, monkeypatch,
                                                                lossless) -> None:
    """Each prompt's output goes through `lossless.check_lossless` (its judging is tested in
    test_lossless.py): near ties land in best.json, anything else fails the search."""
    from dreams_nas.nas.stages import verify
    from dreams_nas.nas.stages.lossless import Checked, Divergence, NotLossless

    run, _ = tiny_run
    real = verify.check_lossless

    def judged(target, prompt, make_drafter, shape, **kw):
        checked = real(target, prompt, make_drafter, shape, **kw)  # float32: identical
        assert checked.divergences == [] and checked.drift_ulps <= 256
        spec_id, index = kw["where"]
        if index != 0:
            return checked
        if not lossless:
            raise NotLossless(f"speculative output of {spec_id} differs at token 3")
        return Checked([Divergence(spec_id, 0, 3, 0.01, 0.02, 0.05, 2.0**-20)], 1.5)

    monkeypatch.setattr(verify, "check_lossless", judged)
    code, out, err = cmd("search", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu",
                         "--verify", "1", "--verify-prompts", "2")
    if not lossless:
        assert code == 1 and "differs at token 3" in err
        assert json.loads(run.best_json(HW).read_text())["measured"] is None
        return
    assert code == 0, err
    measured = json.loads(run.best_json(HW).read_text())["measured"]
    assert (measured["prompts"], measured["identical_prompts"]) == (2, 1)
    assert measured["dtype"] == "float32" and measured["drift_ulps"] == 1.5
    (divergence,) = measured["divergences"]
    assert (divergence["prompt"], divergence["position"]) == (0, 3)
    assert (divergence["margin"], divergence["spec_margin"]) == (0.01, 0.02)
    assert any("1 of 2 prompts identical" in w for w in out["warnings"])


@pytest.mark.parametrize("damage", [None, "[]", "{}", '{"hardware_id": "other"}'])
def test_a_search_without_its_hardware_json_measures_nothing(tiny_run, cmd, damage) -> None:
    """Without hardware.json a verification would run on whatever thread count and machine
    this is: missing, empty or another machine's file is one line naming the fix."""
    run, _ = tiny_run
    path = run.latency_dir(HW) / "hardware.json"
    path.unlink() if damage is None else path.write_text(damage)
    code, _, err = cmd("search", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu",
                       "--verify", "1")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "dreams-nas profile" in err
    assert not run.best_json(HW).exists() and not list(run.root.glob("specs/*"))


@pytest.mark.parametrize("held", ["search", "acceptance"])
def test_a_second_search_of_one_run_folder_is_refused(tiny_run, cmd, held) -> None:
    """Two searches would both score every subnet, measure under each other's load and keep
    the last best.json: the second is refused in one line while the first holds the folder."""
    from _support.holder import hold, stop
    from dreams_nas.nas.stages.inputs import dataset_id

    run, _ = tiny_run
    name = f"search-{HW}" if held == "search" else f"acceptance-{dataset_id('builtin', 2)}"
    proc = hold(run.root, [name])
    try:
        code, _, err = cmd("search", "--limit", "2", "--max-new-tokens", "8", "--device",
                           "cpu", "--verify", "0")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"(pid {proc.pid} on" in err and f"is writing {name} of the run folder" in err
        assert not run.acceptance_csv(dataset_id("builtin", 2)).exists()
        if held == "acceptance":  # `score` of the same data set is refused alike
            code, _, err = cmd("score", "--limit", "2", "--max-new-tokens", "8")
            assert code == 2 and f"is writing {name}" in err
    finally:
        stop(proc)
    code, out, err = cmd("search", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu",
                         "--verify", "0")
    assert code == 0, err


def test_a_reprofiled_machine_gets_a_new_study_not_the_stored_speedups(tiny_run, cmd) -> None:
    """search (optuna) -> refit the latency predictor on other timings -> search again: the
    second search computes its speedups with the new predictor instead of resuming the study."""
    import optuna
    from dreams_nas.latency.model.predictor import LatencyPredictor

    run, _ = tiny_run
    args = ("search", "--method", "optuna", "--trials", "4", "--limit", "4",
            "--max-new-tokens", "12", "--device", "cpu", "--verify", "0")
    code, first, err = cmd(*args)
    assert code == 0, err
    folder = run.latency_dir(HW)
    rows = pd.read_csv(folder / "predictor_train.csv")
    slower = rows.assign(median_ms=rows["median_ms"] * rows["kind"].isin(
        ["draft", "draft_first"]).map({True: 3.0, False: 1.0}))
    LatencyPredictor.fit(slower, HW, holdout=0.0).save(folder)  # a re-profile, in effect
    code, second, err = cmd(*args)
    assert code == 0, err
    assert second["study_name"] != first["study_name"]
    assert second["n_evaluations"] == 4  # a new study: nothing resumed
    storage = f"sqlite:///{run.study_db(HW)}"
    stored = {t.user_attrs["spec_id"]: t.user_attrs["speedup"] for t in optuna.load_study(
        study_name=first["study_name"], storage=storage).trials}
    fresh = {t.user_attrs["spec_id"]: t.user_attrs["speedup"] for t in optuna.load_study(
        study_name=second["study_name"], storage=storage).trials}
    assert all(fresh[s] < stored[s] for s in set(fresh) & set(stored))  # slower drafts
    assert second["predicted"]["speedup"] < first["predicted"]["speedup"]
    key = optuna.load_study(study_name=second["study_name"], storage=storage).user_attrs["key"]
    predictor = json.loads((folder / "predictor.json").read_text())
    assert key["predictor_created"] == predictor["created"]
    assert key["max_new_tokens"] == 12 and key["dtype"] == "float32"


def test_the_front_pair_is_chosen_recorded_and_optimised(tiny_run, cmd) -> None:
    """--objective pareto --front speedup-memory: the study optimises (speedup, draft_bytes),
    best.json and the summary say so, and pareto.csv is that pair's front."""
    import optuna

    run, _ = tiny_run
    code, out, err = cmd("search", "--objective", "pareto", "--front", "speedup-memory",
                         "--method", "optuna", "--trials", "6", "--limit", "4",
                         "--max-new-tokens", "12", "--device", "cpu", "--verify", "0")
    assert code == 0, err
    assert out["front_axes"] == "speedup-memory" and "pareto-speedup-memory" in out["study_name"]
    best = json.loads((run.search_dir(HW) / "best.json").read_text())
    assert best["front"]["axes"] == "speedup-memory"
    assert (best["front"]["maximise"], best["front"]["minimise"]) == ("speedup", "draft_bytes")
    front = pd.read_csv(run.pareto_csv(HW))
    assert list(front["spec_id"]) == best["front"]["spec_ids"] == out["front"]
    trials = pd.read_csv(run.trials_csv(HW))
    assert (trials["draft_bytes"] > 4 * trials["draft_params"]).all()  # fp32 weights + KV
    from dreams_nas.nas.stages.inputs import draft_memory_fn, draft_params_fn
    from dreams_nas.supernet.core.spec import SubnetSpec

    spec = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=3)
    fp32 = draft_memory_fn(run, 100, 40, "float32")
    kv = fp32(spec) - 4 * draft_params_fn(run)(spec)
    config = json.loads((run.supernet_dir / "config.json").read_text())
    assert config["visual_in_self"]  # the default: kept visual tokens in its own sequence
    # 60 text + 20 kept visual positions: 2 layers' KV over its own sequence + the memory
    assert kv == 4 * 2 * 2 * config["head_dim"] * (2 * 80 + 80)
    path = run.supernet_dir / "config.json"
    original = path.read_text()
    path.write_text(json.dumps({**config, "visual_in_self": False}))
    try:  # the memory only: the decoder layers' KV over the 60 text positions
        kv = draft_memory_fn(run, 100, 40, "float32")(spec) - 4 * draft_params_fn(run)(spec)
        assert kv == 4 * 2 * 2 * config["head_dim"] * (2 * 60 + 80)
    finally:
        path.write_text(original)
    assert fp32(spec.replace(visual_keep=1.0)) > fp32(spec)  # more visual tokens kept
    assert fp32(spec.replace(heads=4)) > fp32(spec)
    assert fp32(spec.replace(draft_len=5)) == fp32(spec)
    assert draft_memory_fn(run, 100, 40, "bfloat16")(spec) * 2 == fp32(spec)
    study = optuna.load_study(study_name=out["study_name"],
                              storage=f"sqlite:///{run.study_db(HW)}")
    assert study.metric_names == ["speedup", "draft_bytes"]
    assert study.user_attrs["front"] == "speedup-memory"


def test_a_search_outside_the_profiled_contexts_is_one_line_naming_the_fix(tiny_run,
                                                                          cmd) -> None:
    """The predictor is linear in the context beyond its rows, but a search far from them is
    refused before anything is searched: one line naming the context, the profiled range and
    the fix (exit 2)."""
    from _support.search import fit_synthetic_latency

    run, _ = tiny_run
    args = ("search", "--limit", "2", "--max-new-tokens", "8", "--device", "cpu",
            "--verify", "0", "--no-report")
    code, _, err = cmd(*args)  # the default synthetic profile spans the tiny prompts
    assert code == 0, err
    context = _context_of(run, max_new_tokens=8)
    for path in run.search_dir(HW).iterdir():
        path.unlink()
    fit_synthetic_latency(run, SPACE, HW, contexts=(400, 600, 800))  # a "re-profile"
    code, _, err = cmd(*args)
    assert code == 2 and err.count("\n") == 1
    assert (f"the search runs at context length {context} (the eval prompts' median length "
            "plus half the answer), outside the contexts the latency profile of "
            f"{HW} was timed at: 400..800 (a search may lie up to 10% of that span outside "
            "it: 360..840); its predictions are not trusted that far") in err
    assert ("re-profile with a context grid spanning it, e.g. `dreams-nas profile "
            f"--context-lengths {context} 400 600 800`") in err
    assert not any(run.search_dir(HW).iterdir())  # refused before anything was written


def _context_of(run: RunFolder, max_new_tokens: int) -> int:
    """The context a search of the cached acceptance rows runs at (`context_len_of`)."""
    from dreams_nas.nas.stages.inputs import context_len_of, supernet_hash
    from dreams_nas.supernet.acceptance.table import AcceptanceTable

    (path,) = (run.root / "acceptance").glob("*.csv")
    table = AcceptanceTable(path, supernet_hash(run), path.stem, 0.0,
                            max_new_tokens=max_new_tokens)
    return context_len_of(table, None)


def test_a_profile_with_cycle_rows_prices_the_cycle_overhead(tiny_run, cmd) -> None:
    """Re-fitted with `cycle` rows, the search adds each draft_len's overhead to its cycle."""
    from _support.search import fit_synthetic_latency

    run, _ = tiny_run
    fit_synthetic_latency(run, SPACE, HW, cycle=True)
    code, out, err = cmd("search", "--limit", "4", "--max-new-tokens", "12", "--device", "cpu",
                         "--verify", "0")
    assert code == 0, err
    best = json.loads(run.best_json(HW).read_text())
    assert best["cycle_overhead"] == {"priced": True, "note": None}
    assert out["cycle_overhead_priced"] is True and "no cycle rows" not in err
    trials = pd.read_csv(run.trials_csv(HW))
    assert (trials["cycle_overhead_ms"] == 0.5 + 0.1 * (trials["draft_len"] + 1)).all()
    assert best["predicted"]["cycle_overhead_ms"] == pytest.approx(
        0.5 + 0.1 * (best["spec"]["draft_len"] + 1))


def test_compile_picks_the_profile_of_compiled_or_eager_steps(tmp_path) -> None:
    from dreams_nas.nas.commands.search import hardware_of
    from dreams_nas.supernet.core.errors import InputError

    run = RunFolder(tmp_path / "run")
    for hw in ("cpu-x-1t", "cpu-x-1t-compiled"):
        run.predictor_json(hw).parent.mkdir(parents=True)
        run.predictor_json(hw).write_text("{}")
        run.profile_csv(hw).write_text("")
    root = str(run.root)
    assert hardware_of(root, None, "on") == "cpu-x-1t-compiled"
    assert hardware_of(root, None, "off") == "cpu-x-1t"
    assert hardware_of(root, "cpu-x-1t", None) == "cpu-x-1t"
    with pytest.raises(InputError, match="not a profile of compiled steps"):
        hardware_of(root, "cpu-x-1t", "on")
    run.predictor_json("cpu-x-1t-compiled").unlink()
    with pytest.raises(InputError, match="0 profiles of compiled steps .* --compile on"):
        hardware_of(root, None, "on")


def test_batch_size_picks_the_profile_of_that_batch(tmp_path) -> None:
    from dreams_nas.nas.commands.search import hardware_of, split_batch
    from dreams_nas.supernet.core.errors import InputError

    run = RunFolder(tmp_path / "run")
    for hw in ("cpu-x-1t", "cpu-x-1t-b4", "cpu-x-1t-compiled-b4"):
        run.predictor_json(hw).parent.mkdir(parents=True)
        run.predictor_json(hw).write_text("{}")
        run.profile_csv(hw).write_text("")
    root = str(run.root)
    assert split_batch("cpu-x-1t-compiled-b4") == ("cpu-x-1t-compiled", 4)
    assert split_batch("cpu-x-1t") == ("cpu-x-1t", 1)
    assert hardware_of(root, None, None, 1) == "cpu-x-1t"
    assert hardware_of(root, None, "on", 4) == "cpu-x-1t-compiled-b4"
    assert hardware_of(root, None, "off", 4) == "cpu-x-1t-b4"
    assert hardware_of(root, "cpu-x-1t-b4", None, 4) == "cpu-x-1t-b4"
    with pytest.raises(InputError, match="2 profiles of steps at batch 4 .* --compile"):
        hardware_of(root, None, None, 4)
    with pytest.raises(InputError, match=r"not a profile of steps at batch 8 \(--batch-size 8\)"):
        hardware_of(root, "cpu-x-1t-b4", None, 8)
    with pytest.raises(InputError, match="0 profiles of steps at batch 2 .* --batch-sizes 2"):
        hardware_of(root, None, None, 2)


def test_a_search_at_batch_b_prices_and_verifies_batches(tiny_run, cmd, monkeypatch) -> None:
    """`search --batch-size 2` on the batch-2 profile: chains only (the space's trees left
    out), its pick measured by batched decoding against plain batched decoding, its artefacts
    under the batch's own hardware id."""
    from dataclasses import replace

    from _support.search import fit_synthetic_latency

    run, _ = tiny_run
    space = replace(SPACE, trees=((2, 1),))
    run.save_space(space)
    fit_synthetic_latency(run, space, HW, cycle=True)
    fit_synthetic_latency(run, replace(space, trees=()), f"{HW}-b2", cycle=True, batch=2)
    from dreams_nas.nas.stages import verify_batch

    batches = []
    real = verify_batch.measure_batched
    monkeypatch.setattr(verify_batch, "measure_batched",
                        lambda *a, **k: batches.append(k["batch"]) or real(*a, **k))
    code, out, err = cmd("search", "--limit", "4", "--max-new-tokens", "12", "--device", "cpu",
                         "--verify", "2", "--verify-prompts", "3", "--batch-size", "2")
    assert code == 0, err
    best = json.loads(run.best_json(f"{HW}-b2").read_text())
    assert best["hardware"]["batch"] == 2 and best["hardware"]["hardware_id"] == f"{HW}-b2"
    trials = pd.read_csv(run.trials_csv(f"{HW}-b2"))
    assert len(trials) == SPACE.size and "t2x1" not in " ".join(trials["spec_id"])
    measured = best["measured"]
    assert measured["speedup"] > 0 and measured["identical_prompts"] == measured["prompts"] == 3
    assert batches == [2]  # verified two requests at a time
    assert not run.best_json(HW).exists()  # batch 1 untouched
