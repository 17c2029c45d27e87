"""`dreams-nas profile --batch-sizes`: a profile per batch size, each a hardware id of its own,
timing the batched loop's own steps (chains only); a killed batched profile resumes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.nas import cli

FAST = ["--device", "cpu", "--threads", "1", "--repeats", "2", "--context-lengths", "12", "36"]


@pytest.fixture(autouse=True)
def quick_fits():
    from _support.fits import quick_latency_fits

    with quick_latency_fits():
        yield


def test_a_profile_per_batch_size(small_run, tiny_llava, capsys) -> None:
    from dreams_nas.supernet.core.space import SearchSpace

    small_run.save_space(replace(small_run.space(), trees=((2, 1),)))
    assert isinstance(small_run.space(), SearchSpace)
    argv = ["profile", "--run", str(small_run.root), "--target", tiny_llava, "--json", *FAST,
            "--batch-sizes", "1", "2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    one, two = summary["hardware_ids"]
    assert summary["batch_sizes"] == [1, 2] and two == f"{one}-b2"
    assert [p["batch"] for p in summary["profiles"]] == [1, 2]
    rows = {b: ProfileStore(small_run.profile_csv(h)).read() for b, h in ((1, one), (2, two))}
    assert {"verify_tree", "cycle_tree"} <= set(rows[1].kind)
    assert not {"verify_tree", "cycle_tree"} & set(rows[2].kind)  # batches draft chains
    assert set(rows[2].status) == {"ok"} and (rows[2].median_ms > 0).all()
    hw = json.loads((small_run.latency_dir(two) / "hardware.json").read_text())
    assert hw["batch"] == 2 and hw["hardware_id"] == two
    plan = json.loads((small_run.latency_dir(two) / "plan.json").read_text())
    assert plan["batch"] == 2 and "t" not in plan["verify_after"].split("-")[-1]
    predictor = LatencyPredictor.load(small_run.latency_dir(two))
    assert predictor.fingerprint["batch"] == 2 and predictor.target_ms("decode", [1], 20)[0] > 0
    # each batch size resumes on its own: a rerun times nothing
    assert cli.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert [p["measured"] for p in again["profiles"]] == [0, 0]


@pytest.mark.parametrize(("extra", "match"), [
    (["--batch-sizes", "0"], "argument --batch-sizes: 0 is out of range"),
    (["--batch-sizes", "2", "--transfer-from", "elsewhere"],
     "--transfer-from prices batch 1 .* profile batch 2 here in full"),
])
def test_bad_batch_sizes_are_one_line(small_run, tiny_llava, capsys, extra, match) -> None:
    import re

    code = cli.main(["profile", "--run", str(small_run.root), "--target", tiny_llava, *FAST,
                     *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(match, err), err
