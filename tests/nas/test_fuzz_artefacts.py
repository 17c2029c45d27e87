"""Fuzzing the run folder (hypothesis): a damaged copy of any artefact of a tiny real run —
cut short, overwritten with garbage, replaced by another JSON value, emptied — makes the
command that reads it either give the undamaged run's answer (exit 0: the damage did not touch
what it needs, or it recomputed it) or stop with one line naming the problem (exit 2). Never a
traceback, never an internal error, never a silently different answer.

The commands: `search --verify 0` (reads run.json, the supernet, the latency predictor and the
acceptance rows; recomputes rows it cannot use) and `generate --drafter SPEC_DIR` (reads the
spec folder; its output is the target's greedy output whatever the draft holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from _support.cli import call_cli
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # one tiny run (~10 s, shared), then ~1 s a damaged copy

SMALL = ["--device", "cpu", "--limit", "2", "--max-new-tokens", "5"]
# garbage that is never a digit, a separator or a quote: an overwritten number cannot become
# another valid number of the same file (a CSV or JSON file has no checksum to tell)
GARBAGE = st.binary(min_size=1, max_size=12).map(
    lambda b: bytes(c for c in b if chr(c) not in "0123456789.,-+eE\"\n\r") or b"\xff")
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)


@pytest.fixture(scope="module")
def tiny(tiny_demo, tmp_path_factory) -> dict[str, Any]:
    """A tiny real run (a copy of the session's `tiny_demo`: the demo on the tiny built-in target)
    and the answers of its undamaged copy: the search's best subnet and figures, and
    generate's tokens."""
    from dreams_nas.supernet.core.device import torch_threads

    run = tiny_demo.copy(tmp_path_factory.mktemp("fuzz") / "run")
    demo, cache = tiny_demo.summary, tiny_demo.cache
    with pytest.MonkeyPatch.context() as mp, torch_threads(1):
        tiny_demo.env(mp)
        image = next((cache / "synth").rglob("*.png"))
        state = {"run": run, "cache": cache, "hw": demo["hardware_id"], "image": image,
                 "spec": Path(demo["spec_dir"]).name}
        state["search"] = _answers(state, run)
        assert state["search"] is not None
        state["generate"] = _generated(state, run)
        assert state["generate"] is not None
    return state


def _answers(state: dict[str, Any], run: Path) -> dict | None:
    # --no-report: rendering report.html takes seconds a search and cannot change its exit
    # code or answer (a failure there is one warning line, by design); the report's own
    # tests are tests/reports
    code, summary, err = call_cli("search", "--run", str(run), "--hardware", state["hw"],
                               "--verify", "0", "--threads", "1", "--no-report", *SMALL)
    state["last"] = (code, err)
    if code != 0:
        return None
    return {"best": summary["best"], "predicted": summary["predicted"],
            "front": summary["front"]}


def _generated(state: dict[str, Any], run: Path) -> list[int] | None:
    code, summary, err = call_cli("generate", "--drafter", str(run / "specs" / state["spec"]),
                               "--image", str(state["image"]), "--prompt", "what is it ?",
                               "--device", "cpu", "--max-new-tokens", "6")
    state["last"] = (code, err)
    return None if code != 0 else summary["tokens"]


def _damage(path: Path, how: str, where: float, garbage: bytes, value: Any) -> None:
    data = path.read_bytes()
    cut = int(where * len(data))
    if how == "cut":
        path.write_bytes(data[:cut])
    elif how == "overwrite":
        path.write_bytes(data[:cut] + garbage + data[cut + len(garbage):])
    elif how == "json":
        path.write_text(json.dumps(value))
    else:
        path.write_bytes(b"")


SEARCH_READS = ("run.json", "supernet/config.json", "supernet/model.safetensors",
                "latency/{hw}/predictor.json", "latency/{hw}/predictor.skops",
                "latency/{hw}/predictor_train.csv", "latency/{hw}/hardware.json",
                "acceptance/builtin-eval-n2.csv")
GENERATE_READS = ("specs/{spec}/spec.json", "specs/{spec}/config.json",
                  "specs/{spec}/draft.safetensors")


def _check(tiny: dict[str, Any], tmp_path: Path, artefact: str, how: str, where: float,
           garbage: bytes, value: Any) -> None:
    copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(tiny["run"], copy)
    target = copy / artefact.format(hw=tiny["hw"], spec=tiny["spec"])
    assert target.is_file(), target
    if how == "json" and target.suffix != ".json":
        how = "overwrite"
    _damage(target, how, where, garbage, value)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DREAMS_NAS_CACHE", str(tiny["cache"]))
        mp.setenv("DREAMS_NAS_DEMO_VARIANT", "tiny")
        if artefact in SEARCH_READS:
            answer, clean = _answers(tiny, copy), tiny["search"]
        else:
            answer, clean = _generated(tiny, copy), tiny["generate"]
    code, err = tiny["last"]
    event(f"{artefact.split('/')[-1]} {how}: exit {code}")
    assert "Traceback" not in err and "internal error" not in err, (artefact, how, err)
    if code == 0:
        assert answer == clean, (artefact, how)  # the same answer, or it would have said so
    else:
        assert code == 2, (artefact, how, err)
        last = err.strip().splitlines()[-1]
        assert last.startswith("dreams-nas ") and ": error: " in last, err
    shutil.rmtree(copy)


# a few damaged copies per artefact, the same ones every run (CI must not flake)
FUZZ = settings(max_examples=2, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
DAMAGE = dict(how=st.sampled_from(["cut", "overwrite", "json", "empty"]),
              where=st.floats(0.0, 0.999), garbage=GARBAGE, value=JSON_VALUES)


@pytest.mark.parametrize("artefact", SEARCH_READS)
@FUZZ
@given(**DAMAGE)
def test_a_damaged_artefact_never_changes_the_search_silently(tiny, tmp_path, artefact, how,
                                                              where, garbage, value) -> None:
    _check(tiny, tmp_path, artefact, how, where, garbage, value)


@pytest.mark.parametrize("artefact", GENERATE_READS)
@FUZZ
@given(**DAMAGE)
def test_a_damaged_spec_folder_never_changes_generate_silently(tiny, tmp_path, artefact, how,
                                                               where, garbage, value) -> None:
    _check(tiny, tmp_path, artefact, how, where, garbage, value)
