"""A profile records how its program runs the timed steps (`STEP_REVISION`); a search on a
profile timed by another revision warns that its prices are stale and how to profile again."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.steps import STEP_REVISION
from dreams_nas.nas.stages.profile_checks import profile_fingerprint
from dreams_nas.nas.stages.search import stale_profile_note
from dreams_nas.supernet.core.runfolder import RunFolder


def test_a_profile_records_this_programs_step_revision() -> None:
    hw = detect_hardware("cpu", dtype="float32", threads=1)
    assert profile_fingerprint(hw, "abc")["step_revision"] == STEP_REVISION


def test_a_search_on_another_revisions_profile_says_it_is_stale(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    own = SimpleNamespace(fingerprint={"hardware_id": "cpu-x", "step_revision": STEP_REVISION})
    assert stale_profile_note(own, run, "cpu-x") is None
    before = SimpleNamespace(fingerprint={"hardware_id": "cpu-x", "step_revision": 1})
    note = stale_profile_note(before, run, "cpu-x")
    assert note is not None and "step revision 1" in note
    assert f"revision {STEP_REVISION}" in note and "rerun `dreams-nas profile`" in note
    assert str(run.latency_dir("cpu-x")) in note and "\n" not in note
    # a model fitted without any fingerprint (tests, replays) is not a profile to judge
    assert stale_profile_note(SimpleNamespace(fingerprint={}), run, "cpu-x") is None
    assert stale_profile_note(object(), run, "cpu-x") is None
