from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dreams_nas.nas.candidate import Candidate
from dreams_nas.nas.inputs import (
    PredictorLatency,
    dataset_id,
    read_specs,
    resolve_hardware,
)
from dreams_nas.nas.verify import Measured, gap_warning
from dreams_nas.supernet.errors import InputError, MissingArtefactError
from dreams_nas.supernet.space import SearchSpace, SubnetSpec

SPACE = SearchSpace(heads=(2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3))


def _profile(run, hw):
    run.latency_dir(hw).mkdir(parents=True, exist_ok=True)
    run.profile_csv(hw).write_text("hardware_id\n")
    run.predictor_json(hw).write_text("{}")


def test_resolve_hardware(run_dir) -> None:
    with pytest.raises(MissingArtefactError, match="run `dreams-nas profile` first"):
        resolve_hardware(run_dir, None)
    _profile(run_dir, "cpu-a")
    assert resolve_hardware(run_dir, None) == "cpu-a"
    _profile(run_dir, "nvidia-h100")
    with pytest.raises(InputError, match=r"2 hardware ids are profiled \(cpu-a, nvidia-h100\)"):
        resolve_hardware(run_dir, None)
    with pytest.raises(InputError, match=r"'gpu-x' has no latency profile .* profiled: cpu-a, "
                                         r"nvidia-h100"):
        resolve_hardware(run_dir, "gpu-x")
    assert resolve_hardware(run_dir, "nvidia-h100") == "nvidia-h100"


def test_read_specs(tmp_path) -> None:
    assert len(read_specs("all", SPACE)) == SPACE.size
    ids = tmp_path / "ids.txt"
    ids.write_text("# best two\nh2-v0.50-l1-g3\n\nh4-v1.00-l2-g1\n")
    assert read_specs(str(ids), SPACE) == [SubnetSpec(2, 0.5, 1, 3), SubnetSpec(4, 1.0, 2, 1)]
    listed = tmp_path / "ids.json"
    listed.write_text(json.dumps(["h2-v0.50-l1-g3", {"heads": 4, "visual_keep": 1.0,
                                                     "inject_layer": 2, "draft_len": 3}]))
    assert len(read_specs(str(listed), SPACE)) == 2
    ids.write_text("h2-v0.75-l1-g3\n")
    with pytest.raises(InputError, match=r"The value 0.75 of field 'visual_keep'"):
        read_specs(str(ids), SPACE)
    with pytest.raises(InputError, match="neither 'all' nor a file"):
        read_specs("best", SPACE)


def test_dataset_ids(tmp_path) -> None:
    assert dataset_id("builtin", None) == "builtin-eval-n32"
    assert dataset_id("builtin", 8, seed=3) == "builtin-eval-n8-s3"
    data = tmp_path / "my eval.jsonl"
    data.write_text('{"id": 1}\n')
    first = dataset_id(str(data), 4)
    assert first.startswith("my-eval-") and first.endswith("-n4")
    data.write_text('{"id": 2}\n')
    assert dataset_id(str(data), 4) != first  # another file content, another cache
    with pytest.raises(InputError, match="neither builtin nor an existing"):
        dataset_id(str(tmp_path / "missing.jsonl"), None)


class _FakeFitted:
    def draft_ms(self, specs, context_len):
        return [0.5 * s.heads + context_len / 1000 for s in specs]

    def verify_ms(self, k, context_len):
        return 10.0 + k

    def decode_ms(self, context_len):
        return 9.0


def test_predictor_adapter() -> None:
    lat = PredictorLatency(_FakeFitted())
    assert lat.predict_ms("draft", SubnetSpec(4, 1.0, 2, 3), 100, 1) == pytest.approx(2.1)
    assert lat.predict_ms("verify", None, 100, 4) == 14.0
    assert lat.predict_ms("decode", None, 100, 1) == 9.0
    with pytest.raises(ValueError, match="latency kind 'prefill'"):
        lat.predict_ms("prefill", None, 100, 1)


def _cand(speedup, tau):
    return Candidate(spec=SubnetSpec(4, 1.0, 2, 3), tau=tau, tau_ci=(tau, tau), draft_ms=1.0,
                     verify_ms=12.0, decode_ms=10.0, speedup=speedup, draft_params=100,
                     feasible=True)


def test_gap_warning_names_the_likely_cause() -> None:
    spec = SubnetSpec(4, 1.0, 2, 3)
    close = Measured(spec, tau=3.0, tokens_per_s=110.0, baseline_tokens_per_s=100.0)
    assert gap_warning(_cand(1.2, 3.0), close) is None  # 1.10 vs 1.20: within 15%
    slow = Measured(spec, tau=3.0, tokens_per_s=80.0, baseline_tokens_per_s=100.0)
    text = gap_warning(_cand(1.2, 3.0), slow)
    assert "0.80x vs predicted 1.20x" in text and "latency predictor" in text
    fewer = Measured(spec, tau=2.0, tokens_per_s=80.0, baseline_tokens_per_s=100.0)
    assert "measured tau 2.00 vs scored 3.00" in gap_warning(_cand(1.2, 3.0), fewer)


def test_gap_warning_points_at_the_part_that_differs() -> None:
    spec = SubnetSpec(4, 1.0, 2, 3)
    pred = _cand(1.2, 3.0)  # cycle 3 x 1.0 + 12.0 = 15 ms, decode 10 ms
    loop = Measured(spec, tau=3.0, tokens_per_s=80.0, baseline_tokens_per_s=100.0,
                    draft_ms=1.0, verify_ms=12.0, other_ms=6.0, decode_ms=10.0)
    assert "loop's own work (6.00 ms per cycle" in gap_warning(pred, loop)
    verify = Measured(spec, tau=3.0, tokens_per_s=80.0, baseline_tokens_per_s=100.0,
                      draft_ms=1.0, verify_ms=20.0, other_ms=0.1, decode_ms=10.0)
    assert "a verify pass took 20.00 ms here vs 12.00 ms predicted" in gap_warning(pred, verify)


def test_gap_warning_names_a_slow_draft_and_a_profile_without_the_first_step() -> None:
    spec = SubnetSpec(4, 1.0, 2, 3)
    slow_draft = Measured(spec, tau=3.0, tokens_per_s=60.0, baseline_tokens_per_s=100.0,
                          draft_ms=3.0, verify_ms=12.0, other_ms=0.1, decode_ms=10.0)
    old = _cand(1.2, 3.0)  # no first_draft_ms: the first step taken as hot as the rest
    assert old.first_draft_ms == old.draft_ms == 1.0 and old.cycle_draft_ms == 3.0
    assert "the profile has no draft_first step" in gap_warning(old, slow_draft)
    new = replace(old, first_draft_ms=2.5)  # mean step (2.5 + 2 x 1.0) / 3 = 1.5 ms
    assert new.cycle_draft_ms == 4.5 and new.to_row()["first_draft_ms"] == 2.5
    text = gap_warning(new, slow_draft)
    assert "took 3.00 ms here vs 1.50 ms predicted" in text and "no draft_first" not in text


class _FakeFittedWithFirst(_FakeFitted):
    has_first_draft = True

    def first_draft_ms(self, specs, context_len):
        return [2.0 * s.heads for s in specs]


def test_predictor_adapter_serves_the_first_draft_step_or_falls_back() -> None:
    spec = SubnetSpec(4, 1.0, 2, 3)
    assert PredictorLatency(_FakeFittedWithFirst()).predict_ms("draft_first", spec, 100, 1) == 8.0
    old = PredictorLatency(_FakeFitted())  # a profile from before draft_first
    assert not old.has_first_draft
    assert old.predict_ms("draft_first", spec, 100, 1) == old.predict_ms("draft", spec, 100, 1)


def test_latencies_are_predicted_at_the_mean_decoding_context(tmp_path) -> None:
    """The prompt plus half the answer: the cached rows' or, with none, the greedy traces'."""
    from types import SimpleNamespace

    from dreams_nas.nas.inputs import context_len_of
    from dreams_nas.supernet.acceptance_table import AcceptanceRow, AcceptanceTable

    table = AcceptanceTable(tmp_path / "acc.csv", "hash", "data")
    traces = SimpleNamespace(context_len=50, answer_len=31.0)  # a teacher-forced scorer
    assert context_len_of(table, SimpleNamespace(scorer=traces)) == 66
    spec = SubnetSpec(2, 1.0, 1, 3)
    table.append([AcceptanceRow(spec=spec, tau=2.0, tau_lo=1.8, tau_hi=2.2, supernet_hash="hash",
                                dataset_id="data", n_prompts=10, n_tokens=310, context_len=50)])
    no_scorer = SimpleNamespace(scorer=None)  # with rows cached nothing is traced
    assert context_len_of(table, no_scorer) == 66
