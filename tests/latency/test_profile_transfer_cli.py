"""`dreams-nas profile --transfer-from`: a second device priced from the first's full profile and
five steps measured on it; a later full profile replaces it; a transfer between programs that
are not the same is refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.nas import cli

SOURCE = ["--device", "cpu", "--threads", "1", "--repeats", "2", "--context-lengths", "12", "36"]
HERE = ["--device", "cpu", "--threads", "2", "--repeats", "2"]  # another hardware id: -2t
FULL_ROWS = 2 * 8 + 2 + 14 + 2 * 3  # test_profile_cli.FAST_ROWS: the source's whole plan


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, tiny_llava):
    """A run folder whose 1-thread device is profiled in full, once for the module."""
    from _support.fits import quick_latency_fits
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.space import SearchSpace

    run = RunFolder(tmp_path_factory.mktemp("transfer") / "dreams-run")
    run.save_space(SearchSpace(heads=(1, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                               draft_len=(1, 2, 3)))  # conftest.small_run's
    with quick_latency_fits():
        assert cli.main(["profile", "--run", str(run.root), "--target", tiny_llava, "--quiet",
                         *SOURCE]) == 0
    return run


@pytest.fixture
def profiled(source_run, tmp_path, capsys):
    """(run, the 1-thread source folder): a fresh copy of `source_run`."""
    from _support.fits import quick_latency_fits
    from dreams_nas.supernet.core.runfolder import RunFolder

    capsys.readouterr()
    run = RunFolder(shutil.copytree(source_run.root, tmp_path / "dreams-run"))
    (hw,) = run.hardware_ids()
    with quick_latency_fits():
        yield run, run.latency_dir(hw)


def _transfer(run, source, *extra):
    return cli.main(["profile", "--run", str(run.root), "--json", "--transfer-from",
                     str(source), "--budget", "5", *HERE, *extra])


def test_a_transfer_prices_the_device_from_five_steps_and_a_full_profile_replaces_it(
        profiled, tiny_llava, capsys) -> None:
    run, source = profiled
    assert _transfer(run, source) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["transferred_from"] == [source.name] and summary["measured"] == 5
    assert summary["hardware_id"].endswith("-2t") and summary["rows"] == 5
    folder = run.latency_dir(summary["hardware_id"])
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["transfer"]["sources"] == [source.name] and len(plan["transfer"]["keys"]) == 5
    assert plan["transfer"]["folders"] == [str(source.resolve())]
    assert plan["context_lengths"] == [12, 36] and plan["transfer"]["candidates"] == FULL_ROWS
    measured = ProfileStore(folder / "profile.csv").ok_rows()
    assert sorted(map(list, zip(measured.kind, measured.spec_id, measured.context_len,
                                measured.k, strict=True))) == sorted(plan["transfer"]["keys"])
    # the engines each have a step measured: the draft's, the target's, the loop's own
    assert {"decode", "verify", "cycle"} & set(measured.kind)
    assert {"draft", "draft_first"} & set(measured.kind)
    predictor = LatencyPredictor.load(folder)
    doc = json.loads((folder / "predictor.json").read_text())
    assert doc["transfer"]["measured"] == 5 and doc["transfer"]["candidates"] == FULL_ROWS
    assert doc["n_fit"] == FULL_ROWS and doc["n_holdout"] == 0 and len(doc["holdout"]) == 5
    assert doc["transfer"]["served"]["mape"] >= 0  # the served predictor on the measured steps
    assert all(m["n"] >= 3 for m in doc["metrics_by_kind"].values())
    assert predictor.transfer["sources"][0]["hardware_id"] == source.name
    assert predictor.contexts() == [12, 36]
    # every kind the source prices is priced here, for every step a full profile times
    assert all(predictor.prices(kind) for kind in ("decode", "verify", "cycle", "draft_first"))
    assert (predictor.target_ms("verify", range(2, 9), 24) > 0).all()
    # the demo and search never take a transferred profile for a finished one of its own
    from dreams_nas.nas.stages.profile import ProfileOptions
    from dreams_nas.nas.stages.profile_reuse import profile_changes

    changes = profile_changes(run, ProfileOptions(device="cpu", threads=2, repeats=2, budget="5"),
                              ProfileStore(folder / "profile.csv"), plan,
                              folder / "predictor.json")
    assert any("transferred from another device" in c for c in changes), changes
    # a rerun times nothing new; --fit-only refits the transfer from plan.json's sources
    assert _transfer(run, source) == 0
    assert json.loads(capsys.readouterr().out)["measured"] == 0
    assert cli.main(["profile", "--run", str(run.root), "--fit-only", "--json", *HERE]) == 0
    assert json.loads(capsys.readouterr().out)["transferred_from"] == [source.name]
    # a profile of its own times the rest of the grid, keeps the five and replaces the prices
    assert cli.main(["profile", "--run", str(run.root), "--target", tiny_llava, "--json",
                     "--context-lengths", "12", "36", *HERE]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["measured"] == FULL_ROWS - 5 and own["resumed"] == 5 and own["rows"] == FULL_ROWS
    assert "transferred_from" not in own and not LatencyPredictor.load(folder).transfer
    assert "transfer" not in json.loads((folder / "plan.json").read_text())
    # now that the device holds every step, a transfer would only discard measurements
    assert _transfer(run, source) == 2
    assert "already holds every step" in capsys.readouterr().err


def _edited(source, tmp_path, name, edit):
    """A copy of the source folder with predictor.json or plan.json edited."""
    copy = tmp_path / name
    shutil.copytree(source, copy)
    for file in ("predictor.json", "plan.json"):
        doc = json.loads((copy / file).read_text())
        edit(file, doc)
        (copy / file).write_text(json.dumps(doc))
    return copy


def _fingerprint(key, value):
    def edit(file, doc):
        if file == "predictor.json":
            doc["fingerprint"][key] = value
    return edit


def _space(file, doc):
    if file == "plan.json":
        doc["space"]["heads"] = [1, 2, 4]


@pytest.mark.parametrize("case, edit, message", [
    ("dtype", _fingerprint("dtype", "bfloat16"), "timed with dtype bfloat16"),
    ("target", _fingerprint("architecture_hash", "0" * 16), "timed with architecture_hash"),
    ("compiled", _fingerprint("steps", "compiled"), "timed with steps compiled"),
    ("revision", _fingerprint("step_revision", 1), "timed with step_revision 1"),
    ("space", _space, "another draft space"),
])
def test_a_transfer_between_other_programs_is_refused(profiled, tmp_path, capsys, case, edit,
                                                      message) -> None:
    run, source = profiled
    assert _transfer(run, _edited(source, tmp_path, case, edit)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err
    assert len(run.hardware_ids()) == 1  # nothing timed, no folder of the new device


def test_sources_that_are_no_full_profile_are_refused(profiled, tmp_path, capsys) -> None:
    run, source = profiled
    assert _transfer(run, tmp_path / "nowhere") == 2
    assert "is not a profiled device's folder" in capsys.readouterr().err
    assert _transfer(run, source, "--context-lengths", "12", "36") == 2
    assert "does not go with --transfer-from" in capsys.readouterr().err
    assert _transfer(run, source, "--budget", str(FULL_ROWS)) == 2
    assert "as many as a full profile times" in capsys.readouterr().err
    other = _edited(source, tmp_path, "contexts", lambda file, doc: doc.update(
        context_lengths=[12, 40]) if file == "plan.json" else None)
    assert cli.main(["profile", "--run", str(run.root), "--json", "--transfer-from", str(source),
                     "--transfer-from", str(other), *HERE]) == 2
    assert "one source would be extrapolated" in capsys.readouterr().err
    assert len(run.hardware_ids()) == 1  # every refusal before anything was timed
    assert _transfer(run, source) == 0  # the new device, transferred
    folder = run.latency_dir(json.loads(capsys.readouterr().out)["hardware_id"])
    assert cli.main(["profile", "--run", str(run.root), "--json", "--transfer-from", str(folder),
                     *SOURCE[:4]]) == 2  # back onto the 1-thread device, from a transfer
    assert "holds a transferred predictor" in capsys.readouterr().err
    assert cli.main(["profile", "--run", str(run.root), "--json", "--transfer-from", str(source),
                     *SOURCE[:4]]) == 2  # onto itself
    assert "this device's own profile" in capsys.readouterr().err
