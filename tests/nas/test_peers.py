"""The peer benchmark: every method in the table, outputs checked against HF greedy."""

from __future__ import annotations

import json

import pytest
from _support.search import fit_synthetic_latency, this_cpu
from dreams_nas.nas import cli
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from peers import REFERENCE, Decoded, Method, markdown_table, measure_methods

HW = this_cpu()  # the search measures only on the profiled machine
SPACE = SearchSpace(heads=(1, 2), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 2),
                    trees=((2, 1), (2, 2)))
METHODS = (REFERENCE, "HF prompt lookup", "HF static cache + compile", "HF assisted (small VLM)",
           "ours: plain decoding",
           "ours: prompt lookup",
           "ours: EAGLE-like draft", "ours: full supernet", "ours: NAS-chosen subnet")


def _fixed(name: str, tokens: list[int], forwards: int) -> Method:
    return Method(name, lambda i: Decoded(list(tokens), forwards))


def _raises(i: int) -> Decoded:
    raise ValueError("Image features and image tokens do not match")


def test_differing_and_failing_methods_are_flagged() -> None:
    methods = [_fixed(REFERENCE, [5, 6, 7, 8, 2], 4),
               _fixed("same, fewer forwards", [5, 6, 7, 8, 2], 2),
               _fixed("differs", [5, 6, 9, 8, 2], 2), Method("raises", _raises)]
    rows = {r.name: r for r in measure_methods(methods, 3, repeats=2)}
    assert rows[REFERENCE].identical and rows[REFERENCE].ratio == 1.0
    assert rows[REFERENCE].tau == 1.0 and rows["same, fewer forwards"].tau == 2.0
    assert rows["same, fewer forwards"].identical and rows["same, fewer forwards"].new_tokens == 15
    assert not rows["differs"].identical
    assert rows["raises"].error == "ValueError: Image features and image tokens do not match"
    assert not rows["raises"].identical
    assert len(rows[REFERENCE].per_repeat_tokens_per_s) == 2
    table = markdown_table(list(rows.values()))
    assert "| differs |" in table and "**NO**" in table and "| raises | failed |" in table


def test_unknown_reference_is_refused() -> None:
    with pytest.raises(ValueError,
                       match="reference method 'HF generate \\(greedy\\)' is not among"):
        measure_methods([_fixed("other", [1], 0)], 1)


@pytest.mark.slow  # trains a tiny supernet (~20 s; the tiny built-in target is the session's)
def test_bench_peers_on_a_tiny_searched_run(tmp_path, monkeypatch, capsys, one_thread,
                                            builtin_cache) -> None:
    import bench_peers
    from dreams_nas.supernet.builtin.cache import ensure_builtin_target
    from dreams_nas.supernet.data.prompts import builtin_dataset
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run

    monkeypatch.setenv("DREAMS_NAS_CACHE", str(builtin_cache))  # the session's tiny built-in target
    run = RunFolder(tmp_path / "dreams-run")
    folder = ensure_builtin_target(variant="tiny", progress=False, threads=1)
    target = TargetAdapter.load(folder)
    train_run(run, target, builtin_dataset("train", 4), TrainConfig(
        warmup_steps=4, multires_steps=4, batch_size=2, checkpoint_every=1000, unroll=2),
        SupernetRecipe(max_new_tokens=8, aifd_prompts=1), show_progress=False)
    run.save_space(SPACE)
    fit_synthetic_latency(run, SPACE, HW)
    assert cli.main(["search", "--run", str(run.root), "--limit", "2", "--max-new-tokens", "8",
                     "--verify", "0", "--device", "cpu", "--json", "-q"]) == 0
    capsys.readouterr()
    # the tiny target is its own assistant here: the "assistant" variant takes a minute
    out_file = tmp_path / "peers.json"
    assert bench_peers.main(["--run", str(run.root), "--prompts", "2", "--max-new-tokens", "8",
                             "--repeats", "2", "--assistant", str(folder), "--threads", "1",
                             "--hf-compile-backend", "eager", "--json", "--out",
                             str(out_file)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout.count("\n") == 1  # --json: one line on stdout, the table on stderr
    result = json.loads(stdout)
    assert json.loads(out_file.read_text()) == result and result["table"] in stderr
    rows = {r["method"]: r for r in result["rows"]}
    assert tuple(rows) == METHODS
    failed = {name: r["error"] for name, r in rows.items() if r["error"]}
    assert not failed
    assert all(r["identical"] for r in rows.values())  # lossless, and HF's peers agree here
    assert rows[REFERENCE]["tau"] == 1.0 and rows[REFERENCE]["ratio"] == 1.0
    assert rows["ours: plain decoding"]["tau"] == 1.0
    assert all(1.0 <= r["tau"] <= 9 for r in rows.values())  # measured for every method
    assert all(r["tokens_per_s"] > 0 for r in rows.values())
    best = json.loads(run.best_json(HW).read_text())
    assert result["nas_spec"] == best["spec_id"] and best["spec_id"] in result["table"]
    assert result["eagle_spec"] == "h2-v1.00-l2-g5"
    assert result["table"].count("\n") == len(METHODS) + 1
    # the tree benchmark on the same run: the best chain and the best tree, measured
    import bench_trees

    assert bench_trees.main(["--run", str(run.root), "--prompts", "2", "--max-new-tokens", "8",
                             "--repeats", "2", "--threads", "1", "--json"]) == 0
    stdout, stderr = capsys.readouterr()
    trees = json.loads(stdout)
    chain, tree = trees["rows"]["chain"], trees["rows"]["tree"]
    assert "-g" in chain["spec_id"] and "-t2x" in tree["spec_id"]
    assert chain["identical_prompts"] == tree["identical_prompts"] == 2  # lossless
    assert trees["search_choice"] == best["spec_id"] and isinstance(trees["agrees"], bool)
    assert trees["tree_over_chain"] > 0 and trees["table"] in stderr


def test_full_and_eagle_specs() -> None:
    from peers import full_and_eagle_specs

    space = SearchSpace(heads=(1, 2), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                        draft_len=(1, 3, 7))
    predicted = {"h2-v1.00-l2-g1": 1.1, "h2-v1.00-l2-g3": 1.4, "h2-v1.00-l2-g7": 1.2,
                 "h1-v0.50-l1-g3": 9.0}
    full, eagle = full_and_eagle_specs(space, predicted)
    assert (full.id, eagle.id) == ("h2-v1.00-l2-g3", "h2-v1.00-l2-g5")
    full, _ = full_and_eagle_specs(space, {})  # none predicted: the draft length nearest 5
    assert full.id == "h2-v1.00-l2-g3"
