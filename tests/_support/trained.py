"""A tiny trained run folder (a real tiny LLaVA target, its supernet trained for a few steps, a
small space and a synthetic latency fit), built once per test session and copied per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace

from _support.models import PROMPTS, save_tiny_vlm, tiny_image
from _support.search import fit_synthetic_latency, this_cpu

SPACE = SearchSpace(heads=(2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2), draft_len=(1, 3, 5))
_BUILT: dict[str, tuple[RunFolder, list[SimpleNamespace]]] = {}


def examples(folder: Path, n: int) -> list[SimpleNamespace]:
    found = _listed(folder, n)
    for i, example in enumerate(found):
        tiny_image(i).save(example.image_path)
    return found


def _listed(folder: Path, n: int) -> list[SimpleNamespace]:
    """The examples `examples(folder, n)` writes, as they are once written."""
    return [SimpleNamespace(id=str(i), image_path=str(folder / f"img{i}.png"), prompt=PROMPTS[i])
            for i in range(n)]


N_EXAMPLES = 6


def trained_run(tmp_path_factory) -> tuple[RunFolder, list[SimpleNamespace]]:
    """(run, examples), trained once per test run (~10 s) by whichever xdist worker asks first
    (`_support.shared`); copy it before writing to it."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _BUILT:
        from _support.shared import shared_folder

        root = shared_folder(tmp_path_factory, "trained-run", _train)
        _BUILT[key] = (RunFolder(root / "dreams-run"), _listed(root, N_EXAMPLES))
    return _BUILT[key]


def _train(root: Path) -> None:
    """Train the run into `root`: the target, the examples, `dreams-run`."""
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from dreams_nas.supernet.training.config import TrainConfig
    from dreams_nas.supernet.training.recipe import SupernetRecipe, train_run

    target_dir = save_tiny_vlm("llava", root / "target")
    run = RunFolder(root / "dreams-run")
    target = TargetAdapter.load(target_dir)
    found = examples(root, N_EXAMPLES)
    with torch_threads(1):
        train_run(run, target, found, TrainConfig(warmup_steps=15, multires_steps=15, unroll=2,
                  batch_size=4, lr=5e-3, checkpoint_every=1000),
                  SupernetRecipe(max_new_tokens=16, aifd_prompts=2), show_progress=False)
    run.save_space(SPACE)
    fit_synthetic_latency(run, SPACE, this_cpu())


def copy_run(run: RunFolder, where: Path) -> RunFolder:
    return RunFolder(shutil.copytree(run.root, where))


def write_jsonl(examples: list[SimpleNamespace], path: Path) -> Path:
    """The examples as a LLaVA-style JSONL file (what `--data` reads)."""
    with path.open("w") as handle:
        for ex in examples:
            handle.write(json.dumps({"id": ex.id, "image": ex.image_path, "conversations": [
                {"from": "human", "value": f"<image>\n{ex.prompt}"},
                {"from": "gpt", "value": "an answer"}]}) + "\n")
    return path
