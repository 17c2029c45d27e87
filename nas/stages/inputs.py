"""What `dreams-nas score` and `dreams-nas search` read from the run folder.

Everything heavy (the target, the supernet weights) is loaded lazily: a search whose
acceptance rows are all cached never loads a model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreams_nas.supernet.acceptance.table import AcceptanceRow, AcceptanceTable
from dreams_nas.supernet.core.digests import data_digest
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec

if TYPE_CHECKING:
    from dreams_nas.latency.model.predictor import LatencyPredictor

log = logging.getLogger("dreams_nas")
DEFAULT_EVAL_PROMPTS = 32


# --- hardware and latency ------------------------------------------------------------------
def profiled_hardware(run: RunFolder) -> list[str]:
    """Hardware ids with a fitted latency predictor in this run."""
    return [h for h in run.hardware_ids() if run.predictor_json(h).is_file()]


def resolve_hardware(run: RunFolder, hardware: str | None) -> str:
    profiled = profiled_hardware(run)
    if hardware is None:
        if len(profiled) == 1:
            return profiled[0]
        if not profiled:
            raise MissingArtefactError(
                f"no latency profile in {run.root / 'latency'}; run `dreams-nas profile` first")
        raise InputError(f"{len(profiled)} hardware ids are profiled ({', '.join(profiled)}); "
                         "pick one with --hardware")
    if hardware not in profiled:
        raise InputError(
            f"--hardware {hardware!r} has no latency profile in {run.root / 'latency'}; "
            f"profiled: {', '.join(profiled) if profiled else 'none'} (run `dreams-nas profile` "
            "on that machine, or pick a profiled id)")
    return hardware


def hardware_identity(run: RunFolder, hardware_id: str) -> dict[str, Any]:
    """hardware.json of `hardware_id`: what its latencies were measured on, which a search
    copies into best.json and every spec.json and a verification must reproduce (the device
    kind, the CPU's thread count). Missing, empty or damaged is refused in one line: without it
    a measurement would run on whatever state this machine is in."""
    from dreams_nas.latency.measure.hardware import HardwareInfo

    path = run.hardware_json(hardware_id)
    fix = (f"rerun `dreams-nas profile --run {run.root}` on that machine (it writes the file "
           "and keeps the rows already timed)")
    if not path.is_file():
        raise MissingArtefactError(f"{path} is missing: the latencies of {hardware_id} do not "
                                   f"say what they were measured on; {fix}")
    fix = f"delete it, then {fix}"
    data = read_json(path)
    try:
        info = HardwareInfo.from_dict(data) if isinstance(data, dict) else None
    except TypeError:
        info = None
    if info is None or info.hardware_id != hardware_id or info.kind not in ("cpu", "cuda") \
            or (info.kind == "cpu" and not (isinstance(info.threads, int) and info.threads > 0)):
        raise InputError(f"{path} is not the hardware.json of {hardware_id} (a HardwareInfo "
                         f"object naming hardware_id {hardware_id!r}, its kind and, on a CPU, "
                         f"its thread count); {fix}")
    return data


def load_latency(run: RunFolder, hardware_id: str, dtype: str | None = None
                 ) -> LatencyPredictor:
    """The predictor of `hardware_id`, refused unless it was timed in `dtype` on the run's
    target architecture (another program's latencies would choose the wrong subnet)."""
    from dreams_nas.latency.model.predictor import LatencyPredictor

    target = run.read_run().get("target") or {}
    expect = {"dtype": dtype, "architecture_hash": target.get("architecture_hash")}
    return LatencyPredictor.load(run.latency_dir(hardware_id), expect=expect)


# --- the run folder ------------------------------------------------------------------------
def check_run_folder(run: RunFolder) -> RunFolder:
    """`run`, refused when `--run` names a file (or lies inside one): every stage calls this
    first, since each would otherwise fail later with a misleading message ("does not exist",
    "no trained supernet", FileExistsError)."""
    where = run.root
    while not where.exists() and where != where.parent:
        where = where.parent
    if where.exists() and not where.is_dir():
        inside = "" if where == run.root else f" (it lies inside the file {where})"
        raise InputError(f"--run {run.root} is a file, not a run folder{inside}; pass a folder "
                         "(it is created if missing)")
    return run


# --- supernet ------------------------------------------------------------------------------
def checked_supernet(run: RunFolder) -> dict[str, Any] | None:
    """run.json's `supernet` block when the weights on disk are the ones it records; None when
    the run holds no supernet weights (train one).

    Weights that run.json does not record -- a truncated or replaced model.safetensors, or
    run.json lost -- are an InputError: training over them would silently replace a supernet
    that every acceptance row, spec and best.json of the run was computed with."""
    from dreams_nas.supernet.draft.saving import SUPERNET_WEIGHTS, file_hash

    weights = run.supernet_dir / SUPERNET_WEIGHTS
    if not weights.is_file():
        return None
    block = run.read_run().get("supernet")
    recorded = block.get("hash") if isinstance(block, dict) else None
    actual = file_hash(weights)
    if recorded == actual:
        return block
    if not run.run_json.is_file():
        what = f"{run.run_json} is missing, so nothing records which supernet it is"
    elif recorded is None:
        what = f"{run.run_json} records no supernet.hash"
    else:
        what = f"{run.run_json} records supernet.hash {recorded}"
    raise InputError(
        f"{weights} has hash {actual} but {what}: the weights were truncated or replaced; "
        f"restore that file (and run.json), or retrain with `dreams-nas train --run {run.root}`, "
        "which overwrites it")


def supernet_hash(run: RunFolder) -> str:
    """Hash of the trained weights (what keys the acceptance cache), checked against run.json
    (`checked_supernet`): a supernet that is not the recorded one is refused here rather than
    blamed on the acceptance rows it no longer matches."""
    run.require_supernet()
    block = checked_supernet(run)
    assert block is not None  # require_supernet: the weights are there
    return str(block["hash"])


def draft_params_fn(run: RunFolder) -> Callable[[SubnetSpec], int]:
    """Parameters of each subnet's extracted draft, from the supernet's config alone
    (`DreamDraft.num_params`: they depend on heads, inject_layer, depth and mlp, not on
    visual_keep, draft_vocab -- the LM head is the target's -- or the draft shape)."""
    import torch
    from dreams_nas.supernet.draft.model import DreamDraft
    from dreams_nas.supernet.draft.saving import read_supernet_config

    config = read_supernet_config(run.supernet_dir)
    with torch.device("meta"):
        model = DreamDraft(config)
    memo: dict[tuple[int, int, int, float], int] = {}

    def params(spec: SubnetSpec) -> int:
        key = (spec.heads, spec.inject_layer, spec.depth, spec.mlp)
        if key not in memo:
            memo[key] = int(model.num_params(spec))
        return memo[key]

    return params


def draft_memory_fn(run: RunFolder, context_len: int, visual_tokens: int, dtype: str
                    ) -> Callable[[SubnetSpec], int]:
    """Bytes a subnet's draft holds while decoding at `context_len` tokens of context, of which
    `visual_tokens` are the image's: its weights, the KV cache of its 2 * depth decoder layers
    (`SubnetSpec.depth` on each side of the cross-attention) over its own sequence (the text, plus
    the visual tokens it keeps when the draft keeps them there), and its cross-attention memory (the
    context with the visual tokens it drops left out), all in `dtype`; with a draft vocabulary
    (`SubnetSpec.draft_vocab` < 1) also the LM head's rows it predicts over, which it copies once
    (`DreamDraft.logits`), and their token ids. An estimate from the shapes, not a measurement:
    activations and the allocator's slack are not counted; the target's shared embedding and
    whole LM head are not the draft's."""
    import torch
    from dreams_nas.supernet.core.device import torch_dtype
    from dreams_nas.supernet.core.space import vocab_rows
    from dreams_nas.supernet.draft.saving import read_supernet_config
    from dreams_nas.supernet.draft.state import keep_count

    config = read_supernet_config(run.supernet_dir)
    element = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    params = draft_params_fn(run)
    context, visual = int(context_len), max(0, int(visual_tokens))

    def memory(spec: SubnetSpec) -> int:
        width = spec.heads * config.head_dim  # keys (and values) per token, per layer
        kept = context - visual + keep_count(visual, spec.visual_keep)
        # the decoder layers before the cross-attention and after it, `depth` of each
        kv_tokens = 2 * spec.depth * (kept if config.visual_in_self else context - visual)
        if config.cross_attention:
            kv_tokens += max(1, kept)
        head = 0  # the reduced LM head (rows x hidden) and its int64 token ids
        if spec.draft_vocab < 1.0:
            rows = vocab_rows(config.vocab_size, spec.draft_vocab)
            head = element * rows * config.hidden_size + 8 * rows
        return element * (params(spec) + 2 * width * kv_tokens) + head

    return memory


def read_specs(text: str, space: SearchSpace) -> list[SubnetSpec]:
    """`all`, or a file of spec ids (one per line) or a JSON list of ids/spec objects."""
    if text == "all":
        return list(space.enumerate())
    path = Path(text)
    if not path.is_file():
        raise InputError(f"--specs {text!r} is neither 'all' nor a file of subnet ids")
    body = path.read_text(encoding="utf-8")
    if body.lstrip().startswith("["):
        specs = _specs_of_json(path, body)
    else:
        specs = [SubnetSpec.from_id(line) for line in body.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    if not specs:
        raise InputError(f"--specs file {path} lists no subnet; give one id per line")
    return [space.validate(s) for s in specs]


def _specs_of_json(path: Path, body: str) -> list[SubnetSpec]:
    """The specs of a `--specs` file holding a JSON list of ids and spec objects."""
    import json

    try:
        items = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InputError(f"--specs file {path} is not valid JSON ({exc.msg} at line "
                         f"{exc.lineno}, column {exc.colno}); fix it, or list one subnet id "
                         "per line") from None
    odd = [i for i in items if not isinstance(i, str | dict)]  # a list: the body starts "["
    if odd:
        raise InputError(f"--specs file {path} must hold a JSON list of subnet ids and spec "
                         f"objects; {odd[0]!r} is neither")
    return [SubnetSpec.from_id(i) if isinstance(i, str) else SubnetSpec.from_dict(i)
            for i in items]


# --- evaluation data -----------------------------------------------------------------------
def dataset_id(data: str, limit: int | None, seed: int = 0) -> str:
    """`builtin-eval-n32` (`-s<seed>` when the synthetic set has another seed) or
    `<file stem>-<sha8 of the file and its images>[-n<limit>]`: another picture under the same
    name is another data set (`supernet.core.digests`, each image hashed once)."""
    n = f"-n{limit}" if limit is not None else ""
    if data == "builtin":
        return f"builtin-eval{n or f'-n{DEFAULT_EVAL_PROMPTS}'}{f'-s{seed}' if seed else ''}"
    path = Path(data)
    if not path.is_file():
        raise InputError(f"--data {data!r} is neither builtin nor an existing .jsonl file")
    from dreams_nas.supernet.data.prompts import load_llava_jsonl

    images = [example.image_path for example in load_llava_jsonl(path)]
    digest = data_digest(path, images)[:8]
    words = re.split(r"[^A-Za-z0-9._]+", path.stem)
    stem = "-".join(w for w in words if w).lstrip("._-") or "data"
    return f"{stem}-{digest}{n}"


def load_eval_examples(data: str, limit: int | None, seed: int) -> list[Any]:
    from dreams_nas.supernet.data.prompts import load_examples

    return load_examples(data, "eval", limit, DEFAULT_EVAL_PROMPTS, seed, "--limit")


def other_target(run: RunFolder, recorded: str, wanted: str, rebuilt: bool) -> InputError:
    """The one line refusing a run folder trained on another target than `wanted`; `rebuilt`:
    both are builds of the same named target (another version, variant or seed)."""
    why = (" (another build of the built-in target: another dreams-nas version, variant or "
           "seed)" if rebuilt else "")
    return InputError(
        f"the run folder {run.root} holds a supernet of target {recorded}{why}, not of "
        f"{wanted}; its supernet, acceptance rows, profiles and searches are that target's: "
        "pass another --run folder to run every stage anew")


class RunModels:
    """The run's target and supernet, loaded on first use and then kept, both in the run's
    dtype."""

    def __init__(self, run: RunFolder, device: str = "cpu", dtype: str = "float32") -> None:
        self.run, self.device, self.dtype = run, device, dtype
        self._target: Any = None
        self._draft: Any = None

    @property
    def target(self) -> Any:
        if self._target is None:
            from dreams_nas.supernet.target.adapter import TargetAdapter

            where = self.run.target_source()
            if where is None:
                raise MissingArtefactError(f"no target in {self.run.run_json}; "
                                           "run `dreams-nas train` first")
            log.info("loading target %s", where)
            from dreams_nas.supernet.builtin.resolve import (
                resolve_target,
                same_folder,
                target_folder,
            )
            from dreams_nas.supernet.core.device import torch_dtype
            from dreams_nas.supernet.core.targets import is_named_target

            expected = target_folder(where)  # checked before anything is built
            recorded = (self.run.read_run().get("target") or {}).get("path")
            if is_named_target(where) and recorded and not same_folder(recorded, expected):
                raise other_target(self.run, str(recorded), str(expected), rebuilt=True)
            self._target = TargetAdapter.load(resolve_target(where), target_id=where,
                                              device=self.device, dtype=torch_dtype(self.dtype))
        return self._target

    @property
    def draft(self) -> Any:
        if self._draft is None:
            from dreams_nas.supernet.training.recipe import draft_for_run

            self._draft = draft_for_run(self.target, self.run, device=self.device)
        return self._draft


class LazyScorer:
    """An `AcceptanceScorer` that loads the models and traces the target only when asked."""

    def __init__(self, models: RunModels, *, data: str, limit: int | None, seed: int,
                 supernet_hash: str, dataset_id: str, temperature: float = 0.0,
                 max_new_tokens: int = 64, draft_lens: Sequence[int] = tuple(range(1, 8)),
                 trees: Sequence[Sequence[int]] = (),
                 show_progress: bool | None = None) -> None:
        self.models, self.data, self.limit, self.seed = models, data, limit, seed
        self.supernet_hash, self.dataset_id = supernet_hash, dataset_id
        self.temperature, self.max_new_tokens = float(temperature), int(max_new_tokens)
        self.draft_lens, self.show_progress = tuple(draft_lens), show_progress
        self.trees = tuple(tuple(t) for t in trees)
        self._scorer: Any = None
        self._prompts: list[Any] | None = None

    @property
    def prompts(self) -> list[Any]:
        if self._prompts is None:
            examples = load_eval_examples(self.data, self.limit, self.seed)
            target = self.models.target
            self._prompts = [target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        return self._prompts

    @property
    def scorer(self) -> Any:
        if self._scorer is None:
            if self.temperature == 0.0:
                from dreams_nas.supernet.acceptance.teacher_forced import TeacherForcedScorer

                self._scorer = TeacherForcedScorer(
                    self.models.target, self.models.draft, self.prompts,
                    supernet_hash=self.supernet_hash, dataset_id=self.dataset_id,
                    max_new_tokens=self.max_new_tokens, draft_lens=self.draft_lens,
                    trees=self.trees, seed=self.seed, show_progress=self.show_progress)
            else:
                from dreams_nas.supernet.acceptance.sampled import SampledScorer

                self._scorer = SampledScorer(
                    self.models.target, self.models.draft, self.prompts,
                    supernet_hash=self.supernet_hash, dataset_id=self.dataset_id,
                    temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                    seed=self.seed)
        return self._scorer

    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        return self.scorer.score(specs)


def context_len_of(table: AcceptanceTable, scorer: LazyScorer) -> int:
    """The context the decode runs at, on average: the eval prompts' length plus half the
    answer (every cycle's draft and verify steps see the prompt and the tokens so far).

    From cached rows if any (prompt length and decoded tokens per prompt, as scored), else from
    the target's greedy traces of the prompts (which scoring computes first anyway).
    """
    rows = [r for r in table.load().values() if r.context_len > 0 and r.n_prompts > 0]
    if rows:
        lengths = sorted(r.context_len + r.n_tokens / r.n_prompts / 2 for r in rows)
        return int(round(lengths[len(lengths) // 2]))
    inner = scorer.scorer
    if hasattr(inner, "answer_len"):  # teacher-forced: the greedy traces
        return int(round(inner.context_len + inner.answer_len / 2))
    # sampled scoring has no greedy trace: the prompt length until its rows are cached
    return int(round(sum(int(p["input_ids"].shape[-1]) for p in scorer.prompts)
                     / max(1, len(scorer.prompts))))
