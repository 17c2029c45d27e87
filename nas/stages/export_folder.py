"""`dreams-nas export SPEC --to DIR`: a spec folder as a self-contained folder to deploy.

    DIR/config.json, draft.safetensors     the extracted draft (safetensors: no pickles)
    DIR/spec.json                          the subnet, its target's fingerprint, where and how
                                           it was chosen (hardware id, dtype, batch), its prices
    DIR/custom_generate/generate.py        transformers' entry (`hf_entry.SHIM`) and its
    DIR/custom_generate/requirements.txt   requirements (the dreams-nas package)
    DIR/hashes.json                        sha256 of each file above, checked before decoding
    DIR/README.md                          the model card: what it is for and how to call it

Nothing in it points into the run folder: the folder copied alone works. The model card's
measured figures are the run's verification of this subnet (best.json of the searches that
picked it), with their conditions; a spec no search verified says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import atomic_write_bytes, atomic_write_json, file_sha256
from dreams_nas.supernet.decoding.hf_entry import HASHES

COPIED = ("config.json", "draft.safetensors", "spec.json")


def _measured(spec_dir: Path, spec_id: str) -> list[dict[str, Any]]:
    """The verifications of `spec_id` in the run folder holding `spec_dir` (specs/<id>), if
    it is one: each search's best.json that picked it."""
    run = spec_dir.parent.parent
    found = []
    for best in sorted((run / "search").glob("*/best.json")) if (run / "search").is_dir() else ():
        try:
            data = json.loads(best.read_text())
        except (OSError, ValueError):
            continue
        if data.get("spec_id") == spec_id and data.get("measured"):
            found.append({"hardware_id": best.parent.name, **data["measured"]})
    return found


def model_card(meta: dict[str, Any], measured: list[dict[str, Any]], name: str) -> str:
    """README.md of an exported folder."""
    target = meta.get("target") or {}
    hardware = meta.get("hardware") or {}
    predicted = meta.get("predicted") or {}
    lines = [f"# {name}: a DREAM-S draft searched by dreams-nas", "",
             f"Subnet `{meta.get('spec_id')}` of a DREAM-S supernet, extracted: a speculative-"
             "decoding draft for one target VLM. Greedy output equals the target's own, token "
             "for token; sampled output follows the target's distribution.", "",
             "## Target", "",
             f"- {target.get('id') or 'a model built in memory'} ({target.get('family')}, "
             f"{target.get('num_layers')} layers, hidden {target.get('hidden_size')})",
             f"- architecture hash `{target.get('architecture_hash')}`: another model is "
             "refused in one line", "",
             "## Chosen for", "",
             f"- hardware `{hardware.get('hardware_id')}` ({hardware.get('name')}), "
             f"{meta.get('dtype')}, batch {hardware.get('batch', 1)}, "
             f"{hardware.get('steps', 'dynamic')} steps",
             f"- predicted speedup {predicted.get('speedup', float('nan')):.2f}x at tau "
             f"{meta.get('tau', float('nan')):.2f} (decode phase, over the target's plain "
             "decoding)"]
    for m in measured:
        lines.append(f"- measured on `{m['hardware_id']}`: {m.get('speedup', float('nan')):.2f}x "
                     f"decode phase, {m.get('speedup_end_to_end', float('nan')):.2f}x whole "
                     f"calls, tau {m.get('tau', float('nan')):.2f}, {m.get('prompts')} prompts x "
                     f"{m.get('max_new_tokens')} tokens, {m.get('identical_prompts')} identical "
                     "to greedy")
    if not measured:
        lines.append("- not measured end to end by a search (`dreams-nas search --verify`)")
    lines += ["", "## Use", "", "```python",
              "from transformers import AutoModelForImageTextToText, AutoProcessor",
              "model = AutoModelForImageTextToText.from_pretrained(TARGET)",
              "inputs = AutoProcessor.from_pretrained(TARGET).apply_chat_template(",
              "    messages, add_generation_prompt=True, tokenize=True, return_dict=True,",
              "    return_tensors='pt')",
              f"out = model.generate(**inputs, custom_generate='{name}', trust_remote_code=True,",
              "                     max_new_tokens=128)",
              "```", "",
              "Needs `pip install dreams-nas` (custom_generate/requirements.txt). One request per "
              "call; greedy or sampling (temperature, top_k, top_p); `streamer`, `eos_token_id`, "
              "`max_new_tokens`, `generation_config` and `return_dict_in_generate` as in "
              "`generate`. Beam search, scores and logits processors are refused.", ""]
    return "\n".join(lines)


def export_folder(spec_dir: str | Path, to: str | Path) -> dict[str, Any]:
    """Export `spec_dir` (specs/<spec_id>/ written by `dreams-nas search`) to `to` (module
    docstring); the summary."""
    from dreams_nas.supernet.decoding.hf_entry import write_shim
    from dreams_nas.supernet.decoding.spec import read_spec_json

    source, out = Path(spec_dir).expanduser(), Path(to).expanduser()
    missing = [n for n in COPIED if not (source / n).is_file()]
    if missing:
        raise MissingArtefactError(f"{source} lacks {', '.join(missing)}: not a spec folder "
                                   "with its draft; pass specs/<spec_id>/ of a searched run")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"--to {out} is not empty; give a new or empty folder")
    meta = read_spec_json(source)
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        shutil.copyfile(source / name, out / name)
    shim = write_shim(out)
    files = [*COPIED, *(f"custom_generate/{p.name}" for p in sorted(shim.iterdir()))]
    measured = _measured(source.resolve(), str(meta.get("spec_id")))
    atomic_write_bytes(out / "README.md", model_card(meta, measured, out.name).encode())
    atomic_write_json(out / HASHES, {"sha256": {n: file_sha256(out / n) for n in files}})
    return {"spec_id": meta.get("spec_id"), "to": str(out), "files": [*files, "README.md",
                                                                      HASHES],
            "measured": len(measured)}
