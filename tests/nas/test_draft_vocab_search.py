"""`dreams-nas score` and `search` over a space with draft vocabularies, on a real (tiny) run
folder whose supernet offers a quarter of the target's vocabulary beside the whole one."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from _support.models import save_tiny_vlm
from _support.search import fit_synthetic_latency, this_cpu
from _support.trained import examples
from dreams_nas.nas import cli
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec

# slow: trains a tiny supernet (~10 s), scores and searches it, extracts and decodes drafts
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
HW = this_cpu()
SPACE = SearchSpace(heads=(2, 4), visual_keep=(1.0,), inject_layer=(2,), draft_len=(1, 3),
                    draft_vocab=(0.25, 1.0))


@pytest.fixture(scope="module")
def vocab_run(tmp_path_factory):
    """(run, examples): a tiny LLaVA supernet trained with draft vocabularies (0.25, 1.0)."""
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run

    root = tmp_path_factory.mktemp("vocab-run")
    target = TargetAdapter.load(save_tiny_vlm("llava", root / "target"))
    found = examples(root, 6)
    run = RunFolder(root / "dreams-run")
    with torch_threads(1):
        train_run(run, target, found, TrainConfig(warmup_steps=10, multires_steps=10, unroll=2,
                  batch_size=4, lr=5e-3, checkpoint_every=1000),
                  SupernetRecipe(max_new_tokens=12, aifd_prompts=2, draft_vocab=(0.25, 1.0)),
                  show_progress=False)
    run.save_space(SPACE)
    fit_synthetic_latency(run, SPACE, HW)
    return run, found


def test_each_draft_vocab_is_scored_searched_and_exported(vocab_run, monkeypatch,
                                                          capsys) -> None:
    run, found = vocab_run
    monkeypatch.setattr("dreams_nas.nas.stages.inputs.load_eval_examples",
                        lambda data, limit, seed: found[: limit or len(found)])

    def cmd(*argv):
        code = cli.main([*argv, "--run", str(run.root), "--json", "-q"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)

    assert run.space().draft_vocab == (0.25, 1.0)
    score = cmd("score", "--limit", "3", "--max-new-tokens", "8", "--device", "cpu")
    assert score["n_scored"] == SPACE.size == 8
    acceptance = pd.read_csv(next((run.root / "acceptance").glob("*.csv")))
    assert sorted(set(acceptance["draft_vocab"])) == [0.25, 1.0]
    assert all(SubnetSpec.from_id(i).draft_vocab == n
               for i, n in zip(acceptance["spec_id"], acceptance["draft_vocab"], strict=True))
    out = cmd("search", "--limit", "3", "--max-new-tokens", "8", "--device", "cpu",
              "--verify", "0", "--objective", "pareto")
    assert out["n_scored"] == 0 and out["n_evaluations"] == SPACE.size
    trials = pd.read_csv(run.trials_csv(HW))
    assert sorted(set(trials["draft_vocab"])) == [0.25, 1.0]
    assert "draft_vocab" in pd.read_csv(run.pareto_csv(HW)).columns

    # the search exports the front: its quarter-vocabulary subnets decode losslessly
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.decoding.registry import load_drafter
    from dreams_nas.supernet.target.adapter import TargetAdapter

    front = pd.read_csv(run.pareto_csv(HW))
    quarter = front[front["draft_vocab"] == 0.25]
    assert len(quarter)  # the cheapest step (a quarter of the LM head) is on the tau-latency front
    target = TargetAdapter.load(json.loads(run.run_json.read_text())["target"]["path"])
    inputs = target.build_inputs(found[0].image_path, found[0].prompt)
    plain = plain_generate(target, inputs, max_new_tokens=10).tokens.tolist()
    for spec_id in quarter["spec_id"]:
        folder = run.spec_dir(spec_id)
        saved = json.loads((folder / "spec.json").read_text())
        spec = SubnetSpec.from_dict(saved["spec"])
        assert spec.draft_vocab == 0.25 and spec.id == spec_id == saved["spec_id"]
        fast = generate(target, inputs, load_drafter(folder, target), shape=spec.draft_len,
                        max_new_tokens=10)
        assert fast.tokens.tolist() == plain
