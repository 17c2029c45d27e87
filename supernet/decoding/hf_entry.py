"""The searched draft inside transformers' own `generate`: what a spec folder's
`custom_generate/generate.py` runs.

    out = model.generate(**inputs, custom_generate=spec_dir, trust_remote_code=True,
                         max_new_tokens=64)            # as model.generate(**inputs, ...) returns

transformers 5.24 loads `custom_generate/generate.py` from the folder and calls its `generate`
with the user's model and every argument of the call. That shim (`SHIM`, written into every
spec folder) finds its folder and calls `generate_with_draft`, which checks that the model is
the target the draft was trained for (its architecture hash, refused in one line otherwise),
loads the draft on the model's device in the model's dtype, and decodes with the speculative
loop (`loop.generate`): greedy output equals `model.generate()`'s token for token, sampling
follows the model's distribution. It returns what `generate` returns (the prompt and the new
tokens; with `return_dict_in_generate`, a `GenerateDecoderOnlyOutput` of them), streams the
new tokens to `streamer` cycle by cycle, stops at `eos_token_id` and `max_new_tokens`, and
refuses in one line what it cannot do (beam search, scores, logits processors, a batch of
several requests), naming the option.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from torch import Tensor

# generate's arguments that are the model's inputs (passed to the prefill as they are)
_INPUTS = ("attention_mask", "pixel_values", "image_sizes", "image_grid_thw",
           "pixel_attention_mask", "mm_token_type_ids", "token_type_ids")
# generate's arguments that change its output in ways the speculative loop does not do
_REFUSED = {"num_beams": 1, "num_return_sequences": 1, "output_scores": False,
            "output_logits": False, "output_attentions": False, "output_hidden_states": False,
            "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0,
            "assistant_model": None, "prompt_lookup_num_tokens": None}

HASHES = "hashes.json"  # an exported folder's files and their sha256 (`dreams-nas export`)

SHIM = '''"""dreams-nas: this folder's searched draft inside transformers' generate.

    model.generate(**inputs, custom_generate="<this folder>", trust_remote_code=True, ...)

Needs the dreams-nas package (requirements.txt); the work is
dreams_nas.supernet.decoding.hf_entry.generate_with_draft."""

from pathlib import Path


def generate(model, **kwargs):
    from dreams_nas.supernet.decoding.hf_entry import generate_with_draft, spec_folder

    return generate_with_draft(model, spec_folder(), kwargs)
'''


def write_shim(folder: str | Path) -> Path:
    """`custom_generate/generate.py` (the shim) and its requirements.txt in `folder`."""
    from dreams_nas.supernet.core.io import atomic_write_bytes

    shim = Path(folder) / "custom_generate"
    shim.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(shim / "generate.py", SHIM.encode())
    atomic_write_bytes(shim / "requirements.txt", b"dreams-nas\n")
    return shim


def spec_folder() -> Path:
    """The folder transformers loaded the shim from: `custom_generate` in the calling
    `generate`'s frame (the shim itself runs from transformers' module cache), a local folder
    or a hub id (its snapshot)."""
    frame = inspect.currentframe()
    while frame is not None:
        value = frame.f_locals.get("custom_generate")
        if isinstance(value, str | Path):
            path = Path(value).expanduser()
            if (path / "spec.json").is_file():
                return path
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(str(value)))
        frame = frame.f_back
    raise InputError("the dreams-nas shim runs only from model.generate(custom_generate=<spec "
                     "folder>, trust_remote_code=True)")


def _options(model: Any, kwargs: Mapping[str, Any]) -> Any:
    """The generation config of the call (`generation_config`, else the model's, updated by
    the call's keywords), refusing what the speculative loop does not do."""
    import copy

    config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    config.update(**{k: v for k, v in kwargs.items() if hasattr(config, k) and v is not None})
    for name, default in _REFUSED.items():
        value = kwargs.get(name, getattr(config, name, default))
        if value not in (default, None) and not (name == "repetition_penalty" and value == 1.0):
            raise InputError(f"{name}={value!r} is not supported by the dreams-nas draft's "
                             f"generate; drop it (default {default!r}) or call generate without "
                             "custom_generate")
    for name in ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                 "negative_prompt_ids"):
        if kwargs.get(name):
            raise InputError(f"{name} is not supported by the dreams-nas draft's generate; "
                             "call generate without custom_generate to use it")
    return config


def _target(model: Any) -> Any:
    """The model's adapter, made once and kept on it."""
    from dreams_nas.supernet.target.adapter import TargetAdapter

    adapter = model.__dict__.get("_dreams_adapter")
    if adapter is None:
        adapter = model.__dict__["_dreams_adapter"] = TargetAdapter.from_model(model)
        adapter.__dict__["_own_eos"] = set(adapter.eos_token_ids)
    return adapter


def check_hashes(folder: Path) -> None:
    """Refuse, in one line, an exported folder whose files are not the ones exported (a spec
    folder in its run has no hashes.json: the search wrote it there)."""
    import json

    from dreams_nas.supernet.core.io import file_sha256

    path = folder / HASHES
    if not path.is_file():
        return
    recorded = json.loads(path.read_text()).get("sha256") or {}
    for name, digest in recorded.items():
        if not (folder / name).is_file() or file_sha256(folder / name) != digest:
            raise InputError(f"{folder / name} is not the file exported (its sha256 differs "
                             f"from {HASHES}'s); export the spec again")


def _drafter(folder: Path, target: Any) -> Any:
    """The folder's draft for `target` (the one it was trained for), in the model's dtype."""
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.spec import check_spec_target, read_spec_json
    from dreams_nas.supernet.draft.extract import CompactDraft
    from dreams_nas.supernet.draft.state import SharedTargetModules

    # the drafts are kept on the model's adapter: the folder is checked and loaded once per
    # model, device and dtype (a changed spec.json or draft is another version of the file)
    stamp = (folder / "spec.json").stat().st_mtime_ns
    key = (str(folder.resolve()), str(target.device), str(target.dtype), stamp)
    cached = target.__dict__.setdefault("_dreams_drafts", {})
    if key not in cached:
        check_spec_target(read_spec_json(folder), target, folder)
        check_hashes(folder)
        shared = SharedTargetModules(target.embed_tokens, target.lm_head)
        draft = CompactDraft.from_pretrained(folder, shared, device=target.device,
                                             dtype=target.dtype)
        cached[key] = DreamDrafter(draft, draft.spec)
    return cached[key]


class _Streaming:
    """A drafter that hands each cycle's kept tokens to `streamer` (cut at EOS and the budget
    as the loop cuts them); everything else is the drafter's."""

    def __init__(self, inner: Any, streamer: Any, eos: set[int], budget: int) -> None:
        self._inner, self.streamer, self.eos, self.budget = inner, streamer, eos, budget
        self.sent = 0
        self.ended = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send(self, tokens: list[int]) -> None:
        out = []
        for t in tokens:
            if self.ended or self.sent + len(out) >= self.budget:
                break
            out.append(t)
            self.ended = t in self.eos
        if out:
            self.streamer.put(torch.tensor(out, dtype=torch.long, device="cpu"))
            self.sent += len(out)

    def _opening(self, last: Tensor) -> None:
        if self.sent == 0:
            self.send(last.view(-1).tolist())  # the prefill's token: the first cycle's last

    def propose(self, last: Tensor, *args: Any) -> Any:
        self._opening(last)
        return self._inner.propose(last, *args)

    def propose_tree(self, last: Tensor, *args: Any) -> Any:
        self._opening(last)
        return self._inner.propose_tree(last, *args)

    def update(self, tokens: Tensor, n: int, verify: Any) -> None:
        self.send(tokens.view(-1).tolist())
        self._inner.update(tokens, n, verify)


def generate_with_draft(model: Any, folder: Path, kwargs: dict[str, Any]) -> Any:
    """`model.generate(**kwargs)` with the folder's draft (module docstring)."""
    from dreams_nas.supernet.decoding.loop import generate
    from dreams_nas.supernet.decoding.sampling import SamplingConfig

    input_ids = kwargs.get("input_ids")
    if input_ids is None:
        input_ids = kwargs.get("inputs")
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise InputError("pass input_ids (1, prompt) as the processor returns them")
    if input_ids.shape[0] != 1:
        raise InputError(f"a batch of {input_ids.shape[0]} requests: the dreams-nas draft's "
                         "generate decodes one request per call; call it per request, or use "
                         "`dreams-nas generate --prompts FILE --batch-size B`")
    config = _options(model, kwargs)
    target = _target(model)
    eos = config.eos_token_id
    target.eos_token_ids = (set(target.__dict__["_own_eos"]) if eos is None else
                            {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])})
    prompt = int(input_ids.shape[1])
    budget = config.max_new_tokens or max(1, int(config.max_length or 20) - prompt)
    sampling = (SamplingConfig(temperature=float(config.temperature or 1.0),
                               top_k=int(config.top_k or 0), top_p=float(config.top_p or 1.0))
                if config.do_sample else SamplingConfig())
    drafter = _drafter(folder, target)
    streamer = kwargs.get("streamer")
    if streamer is not None:
        streamer.put(input_ids.cpu())
        drafter = _Streaming(drafter, streamer, target.eos_token_ids, budget)
    inputs = {"input_ids": input_ids, **{k: kwargs[k] for k in _INPUTS
                                         if isinstance(kwargs.get(k), Tensor)}}
    generator = kwargs.get("generator")
    spec = drafter.spec
    out = generate(target, inputs, drafter, shape=spec.shape, max_new_tokens=budget,
                   sampling=sampling, generator=generator)
    if streamer is not None:
        drafter.send(out.tokens.tolist()[drafter.sent:])  # what no cycle passed (the budget)
        streamer.end()
    sequences = torch.cat((input_ids, out.tokens.to(input_ids.device)[None]), dim=1)
    if config.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences
