"""Deterministic acceptance scorer and latency predictor for search tests (no models)."""

from __future__ import annotations

from collections.abc import Sequence

from dreams_nas.latency.model.query import ScalarLatency
from dreams_nas.supernet.acceptance.table import AcceptanceRow
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SubnetSpec

SMALL_SPACE = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                          draft_len=(1, 2, 3, 5))
# A space over draft sizes too: two depths and two MLP widths (SMALL_SPACE x 4).
SIZED_SPACE = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                          draft_len=(1, 2, 3, 5), depth=(1, 2), mlp=(0.5, 1.0))
# A space over draft vocabularies too: a quarter of the target's and the whole (SMALL_SPACE x 2).
VOCAB_SPACE = SearchSpace(heads=(1, 2, 4), visual_keep=(0.5, 1.0), inject_layer=(1, 2),
                          draft_len=(1, 2, 3, 5), draft_vocab=(0.25, 1.0))


def accept_prob(spec: SubnetSpec) -> float:
    """Per-position acceptance: more heads, visual tokens and deeper features help, and so do
    more layers, a wider MLP and a larger draft vocabulary (nothing changes at the paper's size
    over the whole vocabulary, depth 1, mlp 1.0, draft_vocab 1.0)."""
    return min(0.95, 0.35 + 0.08 * spec.heads + 0.15 * spec.visual_keep
               + 0.03 * spec.inject_layer + 0.06 * (spec.depth - 1) - 0.1 * (1.0 - spec.mlp)
               - 0.04 * (1.0 - spec.draft_vocab))


def tau_of(spec: SubnetSpec) -> float:
    """A chain: 1 + a + ... + a^draft_len. A token tree: level i is reached when one of the
    branching[i-1] candidates there is right, 1 - (1 - a)^b, given depth i - 1 was."""
    a = accept_prob(spec)
    if not spec.tree:
        return sum(a**i for i in range(spec.draft_len + 1))
    tau, reach = 1.0, 1.0
    for b in spec.tree:
        reach *= 1 - (1 - a) ** b
        tau += reach
    return tau


class FakeScorer:
    """tau = 1 + a + ... + a^draft_len (i.i.d. acceptance a); counts every spec it scores."""

    def __init__(self, supernet_hash: str = "abc123", dataset_id: str = "builtin", *,
                 dtype: str = "float32", max_new_tokens: int = 64) -> None:
        self.supernet_hash = supernet_hash
        self.dataset_id = dataset_id
        self.dtype, self.max_new_tokens = dtype, max_new_tokens  # an AcceptanceTable's defaults
        self.calls: list[SubnetSpec] = []

    def score(self, specs: Sequence[SubnetSpec]) -> list[AcceptanceRow]:
        self.calls.extend(specs)
        out = []
        for spec in specs:
            tau, a = tau_of(spec), accept_prob(spec)
            out.append(AcceptanceRow(
                spec=spec, tau=tau, tau_lo=tau - 0.1, tau_hi=tau + 0.1,
                supernet_hash=self.supernet_hash, dataset_id=self.dataset_id, dtype=self.dtype,
                max_new_tokens=self.max_new_tokens, n_prompts=4,
                n_tokens=64, context_len=32, accept_rates=(a,) * spec.draft_len,
            ))
        return out


class FakeLatency(ScalarLatency):
    """draft step grows with heads, visual tokens, depth, MLP width and draft vocabulary;
    verify grows slowly with k; no cycle kinds (their overhead is priced 0 ms)."""

    def __init__(self) -> None:
        self.calls = 0

    def step_ms(self, kind: str, spec: SubnetSpec | None, context_len: int, k: int) -> float:
        self.calls += 1
        if kind in ("draft", "draft_first"):  # first step as hot as the rest: old formula
            assert spec is not None  # k > 1: a token tree's level of k nodes
            one = (0.4 + 0.35 * spec.heads + 0.6 * spec.visual_keep + 0.05 * spec.inject_layer
                   + 0.5 * (spec.depth - 1) - 0.3 * (1.0 - spec.mlp)
                   - 0.4 * (1.0 - spec.draft_vocab))  # as before at 1, 1.0, 1.0
            return one * (1 + 0.25 * (k - 1))
        if kind == "verify":
            return 10.0 + 0.9 * k
        if kind == "verify_tree":  # the tree's mask costs a little over a chain of k
            return 10.5 + 0.9 * k
        if kind == "decode":
            return 9.5
        raise ValueError(kind)


def fake_params(spec: SubnetSpec) -> int:
    """Heads and the injection's adapter; each layer pair and the MLP's width add more."""
    return (1000 * spec.heads + 10 * spec.inject_layer + 3000 * (spec.depth - 1)
            - round(1500 * (1.0 - spec.mlp)))


def fit_synthetic_latency(run, space: SearchSpace, hardware_id: str,
                          contexts: Sequence[int] = (16, 32, 64, 128), cycle: bool = False,
                          batch: int = 1) -> None:
    """A latency predictor fitted on synthetic timings, saved as `dreams-nas profile` would, so a
    real run folder can be searched without timing anything (the plumbing is what is tested).
    `contexts`: the context lengths "profiled"; the default spans the tiny targets' prompts and
    answers (a search outside them is refused). A space with draft vocabularies gets draft rows
    for each (a smaller vocabulary a faster step). `cycle`: with the speculative cycle's own
    work (kinds ``cycle``, ``cycle_tree``); without, the profile is one made before them.
    `batch`: the requests per step hardware.json records (`profile --batch-sizes`)."""
    import json

    import pandas as pd
    from dreams_nas.latency.model.predictor import LatencyPredictor

    rows = []
    vocabs = space.draft_vocab if space.draft_vocab != (1.0,) else ()  # () as before it
    for ctx in contexts:
        for h in space.heads:
            for v in space.visual_keep:
                for n in vocabs or (1.0,):  # a smaller LM head drafts faster
                    rows += [{"kind": kind,  # the first step as hot as the rest
                              "spec_id": SubnetSpec(h, v, 1, 1, draft_vocab=n).id,
                              "heads": h, "visual_keep": v, "inject_layer": 1, "draft_len": 1,
                              "context_len": ctx, "k": 1,
                              "median_ms": 0.3 + 0.2 * h + 0.3 * v + 0.001 * ctx
                              - 0.2 * (1.0 - n), **({"draft_vocab": n} if vocabs else {})}
                             for kind in ("draft", "draft_first")]
        for k in range(1, 8):
            rows.append({"kind": "decode" if k == 1 else "verify", "spec_id": "",
                         "heads": float("nan"), "visual_keep": float("nan"),
                         "inject_layer": float("nan"), "draft_len": float("nan"),
                         "context_len": ctx, "k": k, "median_ms": 4.0 + 0.3 * k})
        rows += _synthetic_tree_rows(space, ctx)
        if cycle:
            rows += [{**row, "kind": kind, "median_ms": 0.5 + 0.1 * row["k"]}
                     for row in rows if row["context_len"] == ctx
                     for kind in ({"verify": "cycle", "verify_tree": "cycle_tree"}
                                  .get(row["kind"]),) if kind]
    predictor = LatencyPredictor.fit(pd.DataFrame(rows), hardware_id, holdout=0.0)
    predictor.save(run.latency_dir(hardware_id))
    (run.latency_dir(hardware_id) / "profile.csv").write_text("hardware_id,kind\n")
    from dreams_nas.latency.measure.hardware import detect_hardware

    here = detect_hardware("cpu", dtype="float32", threads=1, batch=batch).to_dict()
    (run.latency_dir(hardware_id) / "hardware.json").write_text(json.dumps(
        {**here, "hardware_id": hardware_id, "name": "test box"}))


def _synthetic_tree_rows(space: SearchSpace, ctx: int) -> list[dict]:
    """The timings a profile of `space`'s token trees adds: each tree's verify (k = nodes + 1)
    and the draft's step over each level width, at the largest and smallest subnet."""
    from dreams_nas.latency.measure.plan import tree_sizes

    verify, levels = tree_sizes(space)
    nan = float("nan")
    rows = [{"kind": "verify_tree", "spec_id": "", "heads": nan, "visual_keep": nan,
             "inject_layer": nan, "draft_len": nan, "context_len": ctx, "k": k,
             "median_ms": 4.2 + 0.3 * k} for k in verify]
    for h, v in ((min(space.heads), min(space.visual_keep)),
                 (max(space.heads), max(space.visual_keep))):
        rows += [{"kind": "draft", "spec_id": f"h{h}-v{v:.2f}-l1-g1", "heads": h,
                  "visual_keep": v, "inject_layer": 1, "draft_len": 1, "context_len": ctx,
                  "k": w, "median_ms": 0.3 + 0.2 * h + 0.3 * v + 0.001 * ctx + 0.05 * w}
                 for w in levels]
    return rows


def this_cpu() -> str:
    """This machine's CPU hardware id at one thread: what a synthetic profile must be called for
    the search to measure its result here (it verifies only on the profiled machine)."""
    from dreams_nas.latency.measure.hardware import detect_hardware

    return detect_hardware("cpu", threads=1).hardware_id


def run_search(space: SearchSpace, acceptance, latency, draft_params, *, context_len: int,
               draft_memory=None, study_key=None, **config):
    """`strategies.search` from the latency model, the parameters and memory of a draft and the
    context (its `Pricing`), and the `SearchConfig` fields as keywords."""
    from dreams_nas.nas.search.candidate import DraftCost, Pricing
    from dreams_nas.nas.search.config import SearchConfig
    from dreams_nas.nas.search.strategies import search

    pricing = Pricing(latency, context_len, DraftCost(draft_params, draft_memory))
    return search(space, acceptance, pricing, SearchConfig(**config), study_key=study_key)


def pricing_of(latency, context_len: int, draft_params=fake_params, draft_memory=None):
    """A `Pricing` of `latency` at `context_len` (the tests' draft parameters by default)."""
    from dreams_nas.nas.search.candidate import DraftCost, Pricing

    return Pricing(latency, context_len, DraftCost(draft_params, draft_memory))
