"""Device hygiene of the engine, checked without a GPU.

1. A rule read from the source: every torch tensor factory in the engine modules names its
   device (``device=``), inherits one (``*_like``, ``Tensor.new_*``) or carries a ``# cpu:
   <reason>`` comment on its line or on a comment line just above.
2. The rule at run time: under ``torch.device("meta")`` as the default device, a factory that
   does not name its device makes a meta tensor, and a meta tensor meeting the model's CPU
   tensors fails ("Tensor on device meta is not on the expected device cpu", or no data to
   copy) the way a CPU tensor meeting a CUDA one fails on a GPU. Decoding and teacher-forced
   scoring must give the same results under it.
3. Host syncs: a greedy speculative cycle copies from the device to the host once (the accepted
   length and tokens together), counted with a `TorchFunctionMode`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import dreams_nas.supernet as supernet_pkg
import pytest
import torch
from _support.models import build_tiny_llava, tiny_prompts
from dreams_nas.supernet.acceptance.teacher_forced import draft_matches, trace_target
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.decoding.drafters import OracleDrafter, PromptLookupDrafter, ReplayDrafter
from dreams_nas.supernet.decoding.dream import DreamDrafter
from dreams_nas.supernet.decoding.loop import generate, plain_generate
from dreams_nas.supernet.decoding.sampling import SamplingConfig
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.state import SharedTargetModules
from dreams_nas.supernet.target.adapter import TargetAdapter
from torch.overrides import TorchFunctionMode

# --- the rule read from the source ----------------------------------------------------------
FACTORIES = frozenset({"arange", "tensor", "as_tensor", "zeros", "ones", "full", "empty",
                       "randn", "rand", "randint", "randperm", "eye", "linspace"})
ENGINE_FOLDERS = ("decoding", "acceptance", "target", "draft", "training")
_ALLOW = re.compile(r"#\s*cpu:\s*\S")  # a reason is required: "# cpu:" alone does not count


def _allowed_lines(source: str) -> tuple[set[int], set[int]]:
    """(lines whose comment allows a CPU factory, those of them holding nothing but it)."""
    anywhere, alone = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and _ALLOW.match(tok.string):
            anywhere.add(tok.start[0])
            if tok.line.lstrip().startswith("#"):
                alone.add(tok.start[0])
    return anywhere, alone


def device_offenders(source: str, filename: str) -> list[str]:
    """'file:line: torch.X(...) without device=' for each tensor factory that names no device.

    Factories are found as ``torch.X(...)`` (``import torch as t`` included) and as bare names
    imported with ``from torch import X [as Y]``. A ``# cpu: <reason>`` comment allows a call
    when it sits on one of the call's lines or alone on the line just above it."""
    tree = ast.parse(source, filename)
    modules, bare = {"torch"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name == "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            bare.update({a.asname or a.name: a.name for a in node.names if a.name in FACTORIES})
    anywhere, alone = _allowed_lines(source)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id in modules and func.attr in FACTORIES):
            name = func.attr
        elif isinstance(func, ast.Name) and func.id in bare:
            name = bare[func.id]
        else:
            continue
        if any(k.arg == "device" for k in node.keywords):
            continue
        span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if span & anywhere or node.lineno - 1 in alone:
            continue
        found.append((node.lineno, f"{filename}:{node.lineno}: torch.{name}(...) without device="))
    return [text for _, text in sorted(found)]


def engine_files() -> list[Path]:
    root = Path(supernet_pkg.__file__).parent
    return sorted(p for folder in ENGINE_FOLDERS for p in (root / folder).rglob("*.py"))


def test_engine_modules_name_the_device_of_every_tensor_they_make() -> None:
    files = engine_files()
    root = Path(supernet_pkg.__file__).parent.parent
    assert {"loop.py", "teacher_forced.py", "adapter.py", "model.py", "tppt.py"} <= {
        p.name for p in files}, "the engine folders moved; update ENGINE_FOLDERS"
    offenders = [line for p in files
                 for line in device_offenders(p.read_text(), str(p.relative_to(root)))]
    assert not offenders, (
        "tensor factories in the engine modules that name no device; pass device= (the device "
        "of the tensors it meets), use *_like / Tensor.new_*, or, for a tensor that lives on "
        "the CPU by design, add a '# cpu: <reason>' comment:\n  " + "\n  ".join(offenders))


def test_the_checker_flags_a_factory_without_a_device() -> None:
    source = ("import torch\n"
              "a = torch.zeros(3)\n"
              "b = torch.arange(4,\n"
              "                 dtype=torch.long)\n"
              "c = torch.ones(2, device=a.device)\n"
              "d = torch.zeros_like(a)\n"
              "e = a.new_zeros(3)\n")
    assert device_offenders(source, "m.py") == [
        "m.py:2: torch.zeros(...) without device=", "m.py:3: torch.arange(...) without device="]


def test_the_checker_follows_import_aliases() -> None:
    source = ("import torch as th\n"
              "from torch import arange as ar, Tensor\n"
              "a = th.rand(3)\n"
              "b = ar(4)\n"
              "c = Tensor()\n")
    assert device_offenders(source, "m.py") == [
        "m.py:3: torch.rand(...) without device=", "m.py:4: torch.arange(...) without device="]


def test_the_cpu_comment_allows_a_call_with_a_reason_only() -> None:
    source = ("import torch\n"
              "a = torch.tensor([1, 2])  # cpu: tokenizer output\n"
              "# cpu: drawn from a CPU generator\n"
              "b = torch.randint(5, (2,))\n"
              "c = torch.ones(3)  # cpu:\n"
              "d = torch.full((2,),\n"
              "               0)  # cpu: a host-side buffer\n"
              "e = torch.empty(2)  # cpu: covers this line only\n"
              "f = torch.eye(2)\n"
              "g = torch.ones(2, dtype=h('# cpu: inside a string'))\n")
    assert device_offenders(source, "m.py") == [
        "m.py:5: torch.ones(...) without device=", "m.py:9: torch.eye(...) without device=",
        "m.py:10: torch.ones(...) without device="]


# --- the rule at run time: a foreign default device ------------------------------------------
MAX_NEW = 10
SPEC = SubnetSpec(2, 0.5, 2, 3)


@pytest.fixture(scope="module")
def llava():
    """A tiny LLaVA target, an untrained DREAM draft for it and two prompts."""
    adapter = TargetAdapter(build_tiny_llava(0, layers=4))
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    cfg = DraftConfig.for_target(adapter.text_config, inject_layers=(2, 4))
    draft = DreamDraft.initialised(cfg, shared, 0)
    return adapter, draft, tiny_prompts(2, seed=3)


def _drafters(adapter, draft, ref):
    return {"dream": lambda: DreamDrafter(draft, SPEC), "oracle": lambda: OracleDrafter(MAX_NEW),
            "replay": lambda: ReplayDrafter(ref), "lookup": PromptLookupDrafter, "plain": None}


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_k=5)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["dream", "oracle", "replay", "lookup", "plain"])
def test_decoding_makes_no_tensor_on_the_default_device(llava, name, sampling) -> None:
    adapter, draft, prompts = llava
    for i, prompt in enumerate(prompts):
        ref = plain_generate(adapter, dict(prompt), max_new_tokens=MAX_NEW).tokens
        make = _drafters(adapter, draft, ref)[name]
        runs = []
        for default in ("cpu", "meta"):
            with torch.device(default):
                out = generate(adapter, dict(prompt), make() if make else None, shape=3,
                               max_new_tokens=MAX_NEW, sampling=sampling,
                               generator=torch.Generator().manual_seed(i))
            assert out.tokens.device.type == "cpu", f"{name}: tokens on {out.tokens.device}"
            runs.append((out.tokens.tolist(), out.stats.cycle_lengths))
        assert runs[0] == runs[1], f"{name}, prompt {i}: the default device changed the output"
        if sampling.greedy:
            assert runs[0][0] == ref.tolist()


def test_teacher_forced_scoring_makes_no_tensor_on_the_default_device(llava) -> None:
    adapter, draft, prompts = llava
    results = []
    for default in ("cpu", "meta"):
        with torch.device(default):
            trace = trace_target(adapter, dict(prompts[0]), (2, 4), MAX_NEW, max_draft_len=4)
            matches = draft_matches(draft, trace, SPEC, max_draft_len=4, chunk=3)
        assert trace.tokens.device.type == trace.visual_mask.device.type == "cpu"
        results.append((trace.tokens.tolist(), matches.tolist()))
    assert results[0] == results[1]
    assert len(results[0][1]) == MAX_NEW - 1  # a start after every token but the last


@pytest.mark.cuda
def test_decoding_and_teacher_forced_scoring_on_cuda_match_the_cpu() -> None:
    adapter = TargetAdapter(build_tiny_llava(0, layers=4).to("cuda"))
    shared = SharedTargetModules(adapter.embed_tokens, adapter.lm_head)
    cfg = DraftConfig.for_target(adapter.text_config, inject_layers=(2, 4))
    draft = DreamDraft.initialised(cfg, shared, 0).to("cuda")
    prompt = tiny_prompts(1, seed=3)[0]
    ref = plain_generate(adapter, dict(prompt), max_new_tokens=MAX_NEW).tokens
    for make in _drafters(adapter, draft, ref).values():
        out = generate(adapter, dict(prompt), make() if make else None, shape=3,
                       max_new_tokens=MAX_NEW)
        assert out.tokens.tolist() == ref.tolist()
    trace = trace_target(adapter, dict(prompt), (2, 4), MAX_NEW, max_draft_len=4)
    assert trace.tokens[trace.prompt_len:].tolist() == ref.tolist()
    matches = draft_matches(draft, trace, SPEC, max_draft_len=4, chunk=3)  # raised before the fix
    assert len(matches) == trace.n_starts and all(0 <= m <= 4 for m in matches)


# --- host syncs ------------------------------------------------------------------------------
_SYNCS = frozenset({"__int__", "__bool__", "__float__", "__index__", "item", "tolist", "nonzero",
                    "numpy", "cpu", "argwhere", "masked_select", "unique"})


class HostSyncs(TorchFunctionMode):
    """Counts the torch calls that wait for the device to hand a value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.paused = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if not self.paused and name in _SYNCS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _paused(counter: HostSyncs, fn):
    def wrapper(*args, **kwargs):
        counter.paused += 1
        try:
            return fn(*args, **kwargs)
        finally:
            counter.paused -= 1
    return wrapper


@pytest.mark.parametrize("name", ["dream", "replay", "oracle"])
def test_a_greedy_cycle_waits_for_the_device_once(llava, name, monkeypatch) -> None:
    """The target's own forward (Hugging Face code) and the drafter's `start` are not counted:
    the loop, the acceptance rule and the drafter's `propose`/`update` are."""
    adapter, draft, prompts = llava
    ref = plain_generate(adapter, dict(prompts[1]), max_new_tokens=MAX_NEW).tokens
    drafter = _drafters(adapter, draft, ref)[name]()
    counter = HostSyncs()
    monkeypatch.setattr(adapter, "prefill", _paused(counter, adapter.prefill))
    monkeypatch.setattr(adapter, "verify", _paused(counter, adapter.verify))
    monkeypatch.setattr(drafter, "start", _paused(counter, drafter.start))
    with counter:
        out = generate(adapter, dict(prompts[1]), drafter, shape=3, max_new_tokens=MAX_NEW)
    assert out.tokens.tolist() == ref.tolist()
    cycles = len(out.stats.cycle_lengths)
    # one for the prefill's token, one per cycle
    assert len(counter.calls) == 1 + cycles, (cycles, counter.calls)
