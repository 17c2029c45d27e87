from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dreams_nas.nas.search.candidate import Candidate
from dreams_nas.nas.stages.inputs import (
    dataset_id,
    read_specs,
    resolve_hardware,
)
from dreams_nas.nas.stages.verify import Measured, gap_warning
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.data.prompts import write_synthetic

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


def test_read_specs_with_broken_json_is_one_line(tmp_path) -> None:
    """A file starting with `[` whose JSON is broken crashed with a JSONDecodeError."""
    broken = tmp_path / "specs.json"
    broken.write_text('["h2-v0.50-l1-g3",\n "h4-v1.00-l2-g1"\n')
    with pytest.raises(InputError, match=rf"^--specs file {broken} is not valid JSON \(Expecting "
                                         r"',' delimiter at line 3, column 1\); fix it, or "
                                         r"list one subnet id per line$"):
        read_specs(str(broken), SPACE)
    broken.write_text('["h2-v0.50-l1-g3", 7]')
    with pytest.raises(InputError, match=r"must hold a JSON list of subnet ids and spec "
                                         r"objects; 7 is neither"):
        read_specs(str(broken), SPACE)


def test_dataset_ids(tmp_path) -> None:
    assert dataset_id("builtin", None) == "builtin-eval-n32"
    assert dataset_id("builtin", 8, seed=3) == "builtin-eval-n8-s3"
    data = write_synthetic(tmp_path / "d", 3, "eval").rename(tmp_path / "d" / "my eval.jsonl")
    first = dataset_id(str(data), 4)
    assert first.startswith("my-eval-") and first.endswith("-n4")
    data.write_text(data.read_text().replace("?", " ?"))
    assert dataset_id(str(data), 4) != first  # another file content, another cache
    with pytest.raises(InputError, match="neither builtin nor an existing"):
        dataset_id(str(tmp_path / "missing.jsonl"), None)


def test_another_picture_under_the_same_name_is_another_data_set(tmp_path) -> None:
    data = write_synthetic(tmp_path / "d", 3, "eval")
    first = dataset_id(str(data), None)
    images = sorted((tmp_path / "d" / "images").iterdir())
    swapped = images[0].read_bytes()
    images[0].write_bytes(images[1].read_bytes())
    second = dataset_id(str(data), None)
    assert second != first
    images[0].write_bytes(swapped)  # the same pictures again: the same id
    assert dataset_id(str(data), None) == first


@pytest.mark.parametrize("name", ["(copy) eval.jsonl", "--eval.jsonl", "._x.jsonl", "é.jsonl"])
def test_every_file_name_gives_a_run_folder_name(tmp_path, name) -> None:
    data = write_synthetic(tmp_path / "d", 1, "eval").rename(tmp_path / "d" / name)
    ident = dataset_id(str(data), None)
    assert RunFolder(tmp_path / "run").acceptance_csv(ident).name == f"{ident}.csv"


def _cand(speedup, tau):
    return Candidate(spec=SubnetSpec(4, 1.0, 2, 3), tau=tau, tau_ci=(tau, tau), draft_ms=1.0,
                     first_draft_ms=1.0, verify_ms=12.0, decode_ms=10.0, speedup=speedup,
                     draft_params=100, feasible=True)


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


def test_gap_warning_names_a_slow_draft_step() -> None:
    spec = SubnetSpec(4, 1.0, 2, 3)
    slow_draft = Measured(spec, tau=3.0, tokens_per_s=60.0, baseline_tokens_per_s=100.0,
                          draft_ms=3.0, verify_ms=12.0, other_ms=0.1, decode_ms=10.0)
    pred = replace(_cand(1.2, 3.0), first_draft_ms=2.5)  # mean step (2.5 + 2 x 1.0) / 3 = 1.5 ms
    assert pred.cycle_draft_ms == 4.5 and pred.to_row()["first_draft_ms"] == 2.5
    assert "a draft step (mean over the cycle" in gap_warning(pred, slow_draft)
    assert "took 3.00 ms here vs 1.50 ms predicted" in gap_warning(pred, slow_draft)


def test_draft_params_and_memory_count_depth_and_mlp(run_dir) -> None:
    """The KV of 2 * depth decoder layers, and the parameters `DreamDraft.num_params` counts."""
    import torch
    from dreams_nas.nas.stages.inputs import draft_memory_fn, draft_params_fn
    from dreams_nas.supernet.draft.config import DraftConfig
    from dreams_nas.supernet.draft.model import DreamDraft

    config = DraftConfig(hidden_size=32, num_heads=4, head_dim=8, intermediate_size=64,
                         vocab_size=50, inject_layers=(1, 2), num_target_layers=2,
                         num_layers=2, mlp_shares=(0.5, 1.0))
    run_dir.supernet_dir.mkdir(parents=True)
    (run_dir.supernet_dir / "config.json").write_text(json.dumps(config.to_dict()))
    params, memory = draft_params_fn(run_dir), draft_memory_fn(run_dir, 100, 40, "float32")
    with torch.device("meta"):
        model = DreamDraft(config)
    one = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=3)
    two, half = one.replace(depth=2), one.replace(mlp=0.5)
    for spec in (one, two, half, two.replace(mlp=0.5)):
        assert params(spec) == model.num_params(spec)
    assert params(two) > params(one) > params(half)
    kv = {spec: memory(spec) - 4 * params(spec) for spec in (one, two, half)}  # fp32 bytes
    # K and V of 2 heads x 8 over 60 text + 20 kept visual positions in each decoder layer
    # (2 * depth of them) and over the cross-attention memory
    assert kv[one] == 4 * 2 * 16 * (2 * 80 + 80)
    assert kv[two] == 4 * 2 * 16 * (4 * 80 + 80)
    assert kv[half] == kv[one]  # a narrower MLP: fewer weights, the same cache


def test_draft_memory_counts_the_draft_vocab_head(run_dir) -> None:
    """A draft vocabulary below the whole copies the LM head's rows it predicts over (and holds
    their ids); its parameters are those of the whole vocabulary's draft (the head is shared)."""
    from dreams_nas.nas.stages.inputs import draft_memory_fn, draft_params_fn
    from dreams_nas.supernet.core.space import vocab_rows
    from dreams_nas.supernet.draft.config import DraftConfig

    config = DraftConfig(hidden_size=32, num_heads=4, head_dim=8, intermediate_size=64,
                         vocab_size=50, inject_layers=(1, 2), num_target_layers=2,
                         vocab_shares=(0.25, 1.0))
    run_dir.supernet_dir.mkdir(parents=True)
    (run_dir.supernet_dir / "config.json").write_text(json.dumps(config.to_dict()))
    params, memory = draft_params_fn(run_dir), draft_memory_fn(run_dir, 100, 40, "float16")
    whole = SubnetSpec(heads=2, visual_keep=0.5, inject_layer=1, draft_len=3)
    quarter = whole.replace(draft_vocab=0.25)
    assert params(quarter) == params(whole)
    rows = vocab_rows(50, 0.25)
    assert rows == 13
    assert memory(quarter) - memory(whole) == 2 * rows * 32 + 8 * rows  # fp16 rows, int64 ids


def test_a_run_of_another_build_of_the_builtin_target_is_refused(tmp_path, monkeypatch) -> None:
    """The built-in target is resolved by name; a run trained on another build of it (another
    version, variant or seed: another cache folder) is refused before anything loads."""
    from dreams_nas.nas.stages.inputs import RunModels
    from dreams_nas.supernet.builtin import resolve
    from dreams_nas.supernet.core.errors import InputError
    from dreams_nas.supernet.core.runfolder import RunFolder

    run = RunFolder(tmp_path / "run")
    run.update_run(target={"id": "builtin", "path": str(tmp_path / "old-build")})
    monkeypatch.setattr(resolve, "target_folder", lambda target: tmp_path / "new-build")
    monkeypatch.setattr(resolve, "resolve_target", lambda target, **_: pytest.fail("built"))
    with pytest.raises(InputError, match=r"holds a supernet of target .*old-build \(another "
                                         r"build of the built-in target.*not of .*new-build; .*"
                                         r"pass another --run folder") as err:
        RunModels(run).target  # noqa: B018 - loading is the property's work
    assert "\n" not in str(err.value)
