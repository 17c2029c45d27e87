"""Side by side against what a user would pick instead: tokens/s, tau and losslessness.

Every method decodes the same prompts with the same target; each one is a callable
``prompt index -> Decoded`` (its new tokens and its target forwards). `measure_methods` runs
them interleaved — per repeat, every prompt through every method in turn, so drift of a shared
machine hits all alike — and reports, per method, the median over repeats of tokens/s (new
tokens over the wall time of the whole generate calls, prefill included), tau (tokens per
target forward after the prefill: 1.0 for plain decoding) and whether every output equals the
reference method's (HF greedy) token for token.

`peer_methods` builds the benchmark's methods for a run folder: HF ``generate`` greedy, HF
prompt lookup, HF assisted generation with a small same-family assistant, and our engine
(``supernet.decoding.generate``, the code path of ``dreams-nas generate``) with the prompt-lookup
drafter, a fixed EAGLE-like DREAM draft, the full supernet draft and the NAS-chosen spec folder.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreams_nas.supernet.core.errors import MissingArtefactError
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec

REFERENCE = "HF generate (greedy)"


@dataclass(frozen=True)
class Decoded:
    tokens: list[int]  # the new tokens (EOS included when produced)
    forwards: int  # target forwards after the prefill


@dataclass(frozen=True)
class Method:
    name: str
    decode: Callable[[int], Decoded]  # prompt index -> output
    note: str = ""


@dataclass(frozen=True)
class PeerRow:
    name: str
    tokens_per_s: float  # median over repeats
    ratio: float  # tokens/s over the reference's
    tau: float  # new tokens after the first per target forward after the prefill
    identical: bool  # every output equals the reference's, token for token
    new_tokens: int  # per pass over the prompts
    per_repeat_tokens_per_s: tuple[float, ...]
    note: str = ""
    error: str = ""  # the method failed: why (tokens/s and tau are then nan)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.name, "tokens_per_s": self.tokens_per_s, "ratio": self.ratio,
                "tau": self.tau, "identical": self.identical, "new_tokens": self.new_tokens,
                "per_repeat_tokens_per_s": list(self.per_repeat_tokens_per_s),
                "note": self.note, "error": self.error}


# --- the configurations the benchmarks compare --------------------------------------------
def full_and_eagle_specs(space: SearchSpace, predicted_speedup: Mapping[str, float],
                         ) -> tuple[SubnetSpec, SubnetSpec]:
    """(the largest subnet -- every heads, visual token, layer a side and MLP channel, the last
    inject layer -- at the draft length of its best predicted speedup -- the draft length
    nearest 5 when the search predicted none of them (an Optuna search may skip them) -- and
    the fixed EAGLE-like configuration: all heads, all visual tokens, the last inject layer,
    one decoder layer a side, the whole MLP, draft_len = 5)."""
    heads, layer = max(space.heads), max(space.inject_layer)
    largest = space.largest().arch.replace(inject_layer=layer)
    full = [s for s in space.enumerate() if not s.tree  # its chains (bench_trees: the trees)
            and s.arch == largest]
    scored = [s for s in full if s.id in predicted_speedup]
    full_best = (max(scored, key=lambda s: predicted_speedup[s.id]) if scored
                 else min(full, key=lambda s: (abs(s.draft_len - 5), s.draft_len)))
    return full_best, SubnetSpec(heads, 1.0, layer, 5, depth=min(space.depth),
                                 mlp=max(space.mlp))


def predicted_speedups(trials_csv: Path) -> dict[str, float]:
    """spec id -> predicted speedup from a search's trials.csv."""
    import csv

    with open(trials_csv, newline="") as handle:
        return {row["spec_id"]: float(row["speedup"]) for row in csv.DictReader(handle)}


# --- measuring -----------------------------------------------------------------------------
@dataclass
class _Tally:
    seconds: list[float] = field(default_factory=list)  # per repeat
    tokens: int = 0
    after_first: int = 0
    forwards: int = 0
    identical: bool = True
    error: str = ""


def measure_methods(methods: Sequence[Method], n_prompts: int, *, repeats: int = 5,
                    reference: str = REFERENCE, warmup: bool = True,
                    on_step: Callable[[], None] | None = None) -> list[PeerRow]:
    """Run every method on prompts 0..n_prompts-1, `repeats` passes, interleaved per prompt.

    A method that raises is kept in the table with its error (and run no further)."""
    names = [m.name for m in methods]
    if reference not in names:
        raise ValueError(f"reference method {reference!r} is not among {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"method names repeat: {names}")
    tally = {m.name: _Tally() for m in methods}
    expected: dict[int, list[int]] = {}
    ref = next(m for m in methods if m.name == reference)
    for i in range(n_prompts):  # the reference outputs, and a warm-up of its first calls
        expected[i] = ref.decode(i).tokens
    if warmup:
        for m in methods:
            _guarded(m, 0, tally[m.name])
    for r in range(repeats):
        for m in methods:
            tally[m.name].seconds.append(0.0)
        for i in range(n_prompts):
            order = methods[r % len(methods):] + methods[:r % len(methods)]  # rotate who goes first
            for m in order:
                t = tally[m.name]
                if t.error:
                    continue
                start = time.perf_counter()
                out = _guarded(m, i, t)
                elapsed = time.perf_counter() - start
                if out is None:
                    continue
                t.seconds[-1] += elapsed
                if r == 0:
                    t.tokens += len(out.tokens)
                    t.after_first += max(0, len(out.tokens) - 1)
                    t.forwards += out.forwards
                t.identical &= out.tokens == expected[i]
                if on_step is not None:
                    on_step()
    ref_tps = _median_tps(tally[reference])
    rows = []
    for m in methods:
        t = tally[m.name]
        tps = _median_tps(t)
        rows.append(PeerRow(
            name=m.name, tokens_per_s=tps, ratio=tps / ref_tps if ref_tps > 0 else float("nan"),
            tau=t.after_first / t.forwards if t.forwards and not t.error else float("nan"),
            identical=t.identical and not t.error, new_tokens=t.tokens,
            per_repeat_tokens_per_s=(() if t.error
                                     else tuple(t.tokens / s for s in t.seconds if s > 0)),
            note=m.note, error=t.error))
    return rows


def _guarded(method: Method, i: int, tally: _Tally) -> Decoded | None:
    try:
        return method.decode(i)
    except Exception as exc:  # a peer that cannot run here is a result, not a crash
        tally.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        return None


def _median_tps(t: _Tally) -> float:
    if t.error or not t.seconds or min(t.seconds) <= 0:
        return float("nan")
    return statistics.median(t.tokens / s for s in t.seconds)


# --- the methods ----------------------------------------------------------------------------
def hf_method(name: str, model: Any, prompts: Sequence[Mapping[str, Any]], max_new_tokens: int,
              note: str = "", **generate_kwargs: Any) -> Method:
    """`model.generate(do_sample=False, ...)` on each prompt; target forwards counted by a hook."""
    import torch

    calls = [0]

    def count(_module: Any, _args: Any, _output: Any) -> None:
        calls[0] += 1

    def decode(i: int) -> Decoded:
        inputs = prompts[i]
        n = inputs["input_ids"].shape[1]
        calls[0] = 0
        handle = model.register_forward_hook(count)
        try:
            with torch.inference_mode():
                out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                     **generate_kwargs)
        finally:
            handle.remove()
        return Decoded(out[0, n:].tolist(), max(0, calls[0] - 1))

    return Method(name, decode, note)


def hf_compile_config(device: Any, backend: str = "inductor") -> Any:
    """HF's own compile settings for `generate`: as it picks them on CUDA (CUDA graphs), and
    on the CPU inductor with the options our compiled steps use (`static.compile_settings`: its
    C++ wrapper), with the flag HF asks for to compile there."""
    from dreams_nas.supernet.target.static import compile_settings
    from transformers import CompileConfig

    config = CompileConfig(**compile_settings(None if backend == "inductor" else backend, device))
    config._compile_all_devices = True  # HF compiles on CUDA/XPU only unless told
    return config


def engine_method(name: str, target: Any, prompts: Sequence[Mapping[str, Any]],
                  make_drafter: Callable[[], Any] | None, draft_len: int, max_new_tokens: int,
                  note: str = "") -> Method:
    """Our engine (`supernet.decoding.generate`, as `dreams-nas generate` runs it)."""
    from dreams_nas.supernet.decoding.loop import generate

    def decode(i: int) -> Decoded:
        drafter = make_drafter() if make_drafter is not None else None
        out = generate(target, dict(prompts[i]), drafter, shape=draft_len,
                       max_new_tokens=max_new_tokens)
        return Decoded(out.tokens.tolist(), out.stats.target_forwards - 1)

    return Method(name, decode, note)


@dataclass(frozen=True)
class PeerSetup:
    """What `peer_methods` needs from a run folder, resolved."""

    best_spec: SubnetSpec
    best_dir: Path
    full_spec: SubnetSpec
    eagle_spec: SubnetSpec
    hardware_id: str


def read_setup(run: Any, hardware_id: str) -> PeerSetup:
    """The NAS-chosen spec folder and the full / EAGLE-like specs of a searched run folder."""
    from dreams_nas.supernet.core.io import read_json

    best_path = run.best_json(hardware_id)
    if not best_path.is_file():
        raise MissingArtefactError(f"no {best_path}; run `dreams-nas search` on this run "
                                   "folder first")
    best = read_json(best_path)
    best_dir = run.root / best["spec_dir"]
    if not (best_dir / "spec.json").is_file():
        raise MissingArtefactError(f"{best_path} names {best_dir}, which holds no spec.json; "
                                   "rerun `dreams-nas search`")
    full, eagle = full_and_eagle_specs(run.space(), predicted_speedups(run.trials_csv(hardware_id)))
    return PeerSetup(SubnetSpec.from_dict(best["spec"]), best_dir, full, eagle, hardware_id)


def peer_methods(target: Any, supernet: Any, setup: PeerSetup, prompts: Sequence[Mapping[str, Any]],
                 *, assistant: Any | None, max_new_tokens: int, hf_lookup_tokens: int = 10,
                 lookup_draft_len: int = 5, hf_compile_backend: str = "inductor") -> list[Method]:
    """The seven methods of the peer benchmark (HF greedy first, the reference) and our plain
    decoding, which separates the engine's own overhead from what drafting gains."""
    from dreams_nas.supernet.decoding.dream import DreamDrafter
    from dreams_nas.supernet.decoding.registry import load_drafter
    from dreams_nas.supernet.draft.extract import extract

    model = target.model
    image_token = getattr(model.config, "image_token_id", None)
    n = max_new_tokens
    methods = [hf_method(REFERENCE, model, prompts, n, note="target alone")]
    methods.append(hf_method(
        "HF prompt lookup", model, prompts, n, prompt_lookup_num_tokens=hf_lookup_tokens,
        **({"suppress_tokens": [image_token]} if image_token is not None else {}),
        note=f"prompt_lookup_num_tokens={hf_lookup_tokens}, suppress_tokens=[image token] "
             "(else it copies image placeholders from the prompt and LLaVA raises in 5.24)"))
    methods.append(hf_method(
        "HF static cache + compile", model, prompts, n, cache_implementation="static",
        compile_config=hf_compile_config(target.device, hf_compile_backend),
        note="HF's own recipe: StaticCache, the decode step torch.compile'd (CUDA graphs on "
             "a GPU; on the CPU inductor with its C++ wrapper, as our steps, and "
             "_compile_all_devices); compiled in the warm-up"))
    if assistant is not None:
        methods.append(hf_method(
            "HF assisted (small VLM)", model, prompts, n, assistant_model=assistant,
            note="assistant_model=, HF's default draft-length schedule"))
    drafts = {"eagle": extract(supernet, setup.eagle_spec),
              "full": extract(supernet, setup.full_spec)}
    # as `dreams-nas generate --drafter`
    nas = load_drafter(setup.best_dir, target, max_new_tokens=n)
    methods += [
        engine_method("ours: plain decoding", target, prompts, None, 1, n,
                      note="no drafter: our loop's own cost, for reading the rows below"),
        engine_method("ours: prompt lookup", target, prompts,
                      lambda: load_drafter("lookup", target),
                      lookup_draft_len, n, note=f"draft_len={lookup_draft_len}"),
        engine_method("ours: EAGLE-like draft", target, prompts,
                      lambda: DreamDrafter(drafts["eagle"], setup.eagle_spec), 5, n,
                      note=f"{setup.eagle_spec.id}: all heads, all visual tokens, last layer, "
                           "draft_len=5"),
        engine_method("ours: full supernet", target, prompts,
                      lambda: DreamDrafter(drafts["full"], setup.full_spec),
                      setup.full_spec.draft_len, n,
                      note=f"{setup.full_spec.id}: the largest subnet at its best predicted "
                           "draft_len"),
        engine_method("ours: NAS-chosen subnet", target, prompts, lambda: nas,
                      nas.default_draft_len, n,
                      note=f"{setup.best_spec.id}: {setup.best_dir.name}/ from best.json "
                           f"({setup.hardware_id})"),
    ]
    return methods


# --- output ---------------------------------------------------------------------------------
def markdown_table(rows: Sequence[PeerRow]) -> str:
    lines = ["| method | tokens/s | x HF generate | tau | identical to greedy | configuration |",
             "|---|---:|---:|---:|:---:|---|"]
    for r in rows:
        if r.error:
            lines.append(f"| {r.name} | failed | - | - | no | {r.error} |")
            continue
        lines.append(f"| {r.name} | {r.tokens_per_s:.1f} | {r.ratio:.2f}x | {r.tau:.2f} | "
                     f"{'yes' if r.identical else '**NO**'} | {r.note} |")
    return "\n".join(lines)


def vision_calls(model: Any | None) -> list[int]:
    """A counter, [n], of the forwards of `model`'s vision tower from now on (HF 5.24 drops the
    pixel values from every assistant call, so an assistant VLM drafts without the image)."""
    counter = [0]
    tower = getattr(getattr(model, "model", None), "vision_tower", None)
    if tower is not None:
        tower.register_forward_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    return counter


def load_assistant(where: str, target: Any, *, device: str = "cpu") -> Any | None:
    """The HF assistant model: `none`, a checkpoint folder, or `builtin` — the built-in target's
    "assistant" variant, built (about a minute) into the same cache as the run's built-in target."""
    if where == "none":
        return None
    from dreams_nas.supernet.core.errors import InputError

    if where == "builtin":
        from dreams_nas.supernet.builtin.cache import ensure_builtin_target

        path = Path(getattr(target, "path", None) or "")
        cache = path.parent.parent if path.parent.name == "builtin-target" else None
        folder = ensure_builtin_target(cache, variant="assistant")
    else:
        folder = Path(where).expanduser()
        if not folder.is_dir():
            raise InputError(f"--assistant {where!r} is not a checkpoint folder; pass builtin, "
                             "none or the folder of a small model with the target's tokenizer")
    from dreams_nas.supernet.target.loading import load_model_and_processor

    model = load_model_and_processor(folder, device=device, dtype=None).model
    return model.eval()
