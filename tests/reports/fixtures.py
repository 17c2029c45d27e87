"""Hand-made run folders in exactly the documented formats (SCHEMAS.md), with realistic numbers.

The numbers follow the search's cost model so the figures look like a real run: per-position
acceptance decays with the draft position and grows with heads, visual tokens kept and a deep
injected layer; the draft step costs more with more heads and more visual tokens, the cycle's
first draft step (right after the verify) a little more than the others, and the target verify
step grows slowly with the positions verified.
`speedup = τ·T_decode / (T_first_draft + (γ−1)·T_draft + T_verify)`.
Hardware models differ in how much heads cost relative to the target step, so each machine has
its own best subnet (the cross-hardware table).

reports/ reads these files, never this module; the tests use it to know the expected answers.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

TRIAL_COLUMNS = (
    "number", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len", "tau", "tau_lo",
    "tau_hi", "draft_ms", "first_draft_ms", "verify_ms", "decode_ms", "speedup", "draft_params",
    "draft_bytes", "cycle_ms", "feasible", "state", "method", "objective",
)
ACCEPT_COLUMNS = (
    "supernet_hash", "dataset_id", "spec_id", "heads", "visual_keep", "inject_layer", "draft_len",
    "temperature", "method", "tau", "tau_lo", "tau_hi", "n_prompts", "n_tokens",
    *(f"accept_rate_{i}" for i in range(1, 8)), "context_len",
)
SUPERNET_HASH = "3f9a2c41d07be815"
VERSIONS = {"python": "3.11.2", "dreams-nas": "0.1.0", "torch": "2.13.0",
            "transformers": "5.24.0", "optuna": "5.0.0", "scikit-learn": "1.7.2",
            "numpy": "2.3.4", "pandas": "2.3.3"}


@dataclass(frozen=True)
class Hardware:
    """A cost model of one machine (ms)."""

    hardware_id: str
    kind: str
    name: str
    decode_ms: float            # one target decoding step
    draft_base_ms: float        # draft step with one head and no visual tokens
    per_head_ms: float          # added per kept head
    per_keep_ms: float          # added at visual_keep = 1.0 (linear in the fraction)
    verify_slope: float         # T_verify(γ) = decode_ms * (1 + verify_slope * γ)
    first_draft_extra: float = 0.15  # first draft step of a cycle = (1 + this) * draft step
    created: str = "2026-11-30T14:00:00+00:00"


CPU = Hardware("cpu-amd-epyc-7b13-2t", "cpu", "AMD EPYC 7B13 (2 threads)", decode_ms=41.7,
               draft_base_ms=2.1, per_head_ms=1.35, per_keep_ms=2.6, verify_slope=0.085)
H100 = Hardware("nvidia-h100-80gb-hbm3", "cuda", "NVIDIA H100 80GB HBM3", decode_ms=14.2,
                draft_base_ms=1.55, per_head_ms=0.06, per_keep_ms=0.21, verify_slope=0.012,
                created="2026-11-30T15:00:00+00:00")
A10G = Hardware("nvidia-a10g", "cuda", "NVIDIA A10G", decode_ms=23.9, draft_base_ms=1.8,
                per_head_ms=0.19, per_keep_ms=0.55, verify_slope=0.03,
                created="2026-11-30T13:00:00+00:00")


@dataclass(frozen=True)
class Space:
    heads: tuple[int, ...] = (2, 4, 6, 8)
    visual_keep: tuple[float, ...] = (0.25, 0.5, 1.0)
    inject_layer: tuple[int, ...] = (4, 8, 12, 16)
    draft_len: tuple[int, ...] = (1, 3, 5, 7)

    def specs(self) -> list[tuple[int, float, int, int]]:
        return list(product(self.heads, self.visual_keep, self.inject_layer, self.draft_len))

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": 1, "heads": list(self.heads),
                "visual_keep": list(self.visual_keep), "inject_layer": list(self.inject_layer),
                "draft_len": list(self.draft_len)}


def spec_id(h: int, v: float, lyr: int, g: int) -> str:
    return f"h{h}-v{v:.2f}-l{lyr}-g{g}"


def accept_rates(h: int, v: float, lyr: int, g: int, num_layers: int = 16) -> list[float]:
    """Per-position acceptance (conditional on the previous positions being accepted)."""
    quality = 0.47 + 0.03 * h + 0.1 * v + 0.12 * (1 - abs(lyr - 0.75 * num_layers) / num_layers)
    return [min(0.95, quality) * (0.93 ** i) for i in range(g)]


def tau_of(rates: Sequence[float]) -> float:
    # Expected tokens per cycle: 1 (the target's own) + P(first i drafts all accepted) summed.
    out, alive = 1.0, 1.0
    for r in rates:
        alive *= r
        out += alive
    return out


def draft_params(h: int) -> int:
    # Heads change the attention projections; the embedding/LM head are shared with the target.
    return 2_359_296 + 147_456 * h


def trial_row(number: int, hw: Hardware, spec: tuple[int, float, int, int], method: str,
              objective: str, max_draft_ms: float | None = None) -> dict[str, Any]:
    h, v, lyr, g = spec
    rates = accept_rates(h, v, lyr, g)
    tau = tau_of(rates)
    draft_ms = hw.draft_base_ms + hw.per_head_ms * h + hw.per_keep_ms * v
    first_draft_ms = (1 + hw.first_draft_extra) * draft_ms
    verify_ms = hw.decode_ms * (1 + hw.verify_slope * g)
    speedup = tau * hw.decode_ms / (first_draft_ms + (g - 1) * draft_ms + verify_ms)
    half = 0.04 * tau
    feasible = max_draft_ms is None or draft_ms <= max_draft_ms
    return {
        "number": number, "spec_id": spec_id(h, v, lyr, g), "heads": h, "visual_keep": v,
        "inject_layer": lyr, "draft_len": g, "tau": round(tau, 6), "tau_lo": round(tau - half, 6),
        "tau_hi": round(tau + half, 6), "draft_ms": round(draft_ms, 6),
        "first_draft_ms": round(first_draft_ms, 6), "verify_ms": round(verify_ms, 6),
        "decode_ms": hw.decode_ms, "speedup": round(speedup, 6),
        "draft_params": draft_params(h),
        # fp16 weights + the KV of 2 layers over 640 tokens and the memory (576 visual tokens)
        "draft_bytes": 2 * (draft_params(h) + 2 * h * 64 * (2 * 640 + round(640 - 576 * (1 - v)))),
        "cycle_ms": round(first_draft_ms + (g - 1) * draft_ms + verify_ms, 6),
        "feasible": int(feasible), "state": "complete", "method": method, "objective": objective,
    }


def front_ids(rows: Sequence[dict[str, Any]]) -> set[str]:
    """The search's front for objective 'pareto': max speedup, min draft params (feasible only).

    Every pair compared, up to 5000 rows; above, a sweep (the pairs would take minutes)."""
    ok = [r for r in rows if r["feasible"] and r["speedup"] != ""]
    if len(ok) > 5000:
        return _front_ids_by_sweep(ok)
    out = set()
    for r in ok:
        dominated = any(
            o["speedup"] >= r["speedup"] and o["draft_params"] <= r["draft_params"]
            and (o["speedup"] > r["speedup"] or o["draft_params"] < r["draft_params"])
            for o in ok
        )
        if not dominated:
            out.add(r["spec_id"])
    return out


def _front_ids_by_sweep(ok: Sequence[dict[str, Any]]) -> set[str]:
    """`front_ids` of scored feasible rows, cheapest first: a row is on the front when it is the
    fastest of its parameter count and faster than every cheaper row."""
    out, faster_than = set(), -math.inf  # the fastest of the cheaper rows
    by_params: dict[int, list[dict[str, Any]]] = {}
    for r in ok:
        by_params.setdefault(r["draft_params"], []).append(r)
    for params in sorted(by_params):
        top = max(r["speedup"] for r in by_params[params])
        if top > faster_than:
            out |= {r["spec_id"] for r in by_params[params] if r["speedup"] == top}
        faster_than = max(faster_than, top)
    return out


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in columns})


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def hardware_json(hw: Hardware) -> dict[str, Any]:
    gpu = hw.kind == "cuda"
    return {"hardware_id": hw.hardware_id, "kind": hw.kind, "name": hw.name,
            "memory_gb": 79.6 if gpu else None, "driver": "570.86.15" if gpu else None,
            "cuda": "12.8" if gpu else None, "clocks": {"sm_mhz": 1980} if gpu else None,
            "threads": None if gpu else 2, "torch": "2.13.0", "transformers": "5.24.0",
            "dtype": "bfloat16" if gpu else "float32"}


def write_search(root: Path, hw: Hardware, specs: Sequence[tuple[int, float, int, int]], *,
                 optuna: bool = False, seed: int = 0, verified_top: int = 3,
                 measured: bool = True, extra_columns: bool = False,
                 max_draft_ms: float | None = None) -> list[dict[str, Any]]:
    """search/<hw>/{trials,pareto}.csv, best.json (+ history.csv for Optuna) and specs/<best>/."""
    method = "optuna" if optuna else "exhaustive"
    rng = np.random.default_rng(seed)
    order = list(specs)
    if optuna:
        # TPE visits a subset, largest and smallest first (as the search enqueues them).
        picks = rng.choice(len(order), size=max(1, int(0.6 * len(order))), replace=False)
        order = [max(specs), min(specs)] + [order[i] for i in picks if order[i] not in
                                            (max(specs), min(specs))]
    rows = [trial_row(i, hw, s, method, "pareto", max_draft_ms) for i, s in enumerate(order)]
    visited = set(order)
    unvisited = [s for s in specs if s not in visited]
    if optuna and unvisited:
        # A trial without a score: the writer leaves the NaN cells empty.
        rows.append({**trial_row(len(rows), hw, unvisited[0], method, "pareto", max_draft_ms),
                     "tau": "", "speedup": ""})
    if extra_columns:
        for r in rows:
            r["user_attrs_note"] = "extra column a newer writer may add"
    ids = front_ids(rows)
    d = root / "search" / hw.hardware_id
    columns = TRIAL_COLUMNS + (("user_attrs_note",) if extra_columns else ())
    _write_csv(d / "trials.csv", columns, rows)
    _write_csv(d / "pareto.csv", columns, [r for r in rows if r["spec_id"] in ids])
    scored = [r for r in rows if r["speedup"] != ""]
    best = max((r for r in scored if r["feasible"]), key=lambda r: r["speedup"])
    if optuna:
        hist, best_so_far = [], -math.inf
        for r in rows:
            value = r["speedup"]
            if value != "":
                best_so_far = max(best_so_far, value)
            hist.append({"number": r["number"], "value": value, "best_so_far": best_so_far})
        _write_csv(d / "history.csv", ("number", "value", "best_so_far"), hist)
    top = sorted((r for r in scored if r["spec_id"] in ids), key=lambda r: -r["speedup"])
    top = top[:verified_top] if best in top[:verified_top] else [best] + top[: verified_top - 1]
    # Measured end to end: a little below the prediction (Python overheads), never identical.
    verified = [{"spec_id": r["spec_id"], "predicted_speedup": r["speedup"],
                 "measured_speedup": round(r["speedup"] * (0.9 + 0.05 * float(rng.random())), 6),
                 "measured_tau": round(r["tau"] * (0.97 + 0.04 * float(rng.random())), 6)}
                for r in top]
    best_verified = next(v for v in verified if v["spec_id"] == best["spec_id"])
    spec = {"schema_version": 1, "heads": best["heads"], "visual_keep": best["visual_keep"],
            "inject_layer": best["inject_layer"], "draft_len": best["draft_len"]}
    predicted = {"speedup": best["speedup"], "tau": best["tau"],
                 "tau_ci": [best["tau_lo"], best["tau_hi"]], "draft_ms": best["draft_ms"],
                 "first_draft_ms": best["first_draft_ms"], "verify_ms": best["verify_ms"],
                 "decode_ms": best["decode_ms"]}
    base_tps = round(1000.0 / hw.decode_ms, 3)
    measured_obj = {"speedup": best_verified["measured_speedup"],
                    "tau": best_verified["measured_tau"],
                    "tokens_per_s": round(base_tps * best_verified["measured_speedup"], 3),
                    "baseline_tokens_per_s": base_tps} if measured else None
    _write_json(d / "best.json", {
        "hardware_id": hw.hardware_id, "objective": "pareto", "method": method, "spec": spec,
        # the front `front_ids` makes, and one row per evaluation: what the search records
        "front": {"axes": "speedup-params", "maximise": "speedup", "minimise": "draft_params",
                  "spec_ids": [r["spec_id"] for r in sorted(
                      (r for r in scored if r["spec_id"] in ids), key=lambda r: -r["speedup"])]},
        "n_evaluations": len(rows),
        "spec_id": best["spec_id"], "spec_dir": f"specs/{best['spec_id']}",
        "predicted": predicted, "measured": measured_obj,
        "verified": verified if measured else [], "hardware": hardware_json(hw),
        "supernet_hash": SUPERNET_HASH, "created": hw.created, "versions": VERSIONS,
    })
    _write_json(root / "specs" / best["spec_id"] / "spec.json", {
        "schema_version": 1, "spec": spec, "target": {"id": "builtin"},
        "supernet_hash": SUPERNET_HASH, "hardware": hardware_json(hw), "predicted": predicted,
        "tau": best["tau"], "tau_ci": [best["tau_lo"], best["tau_hi"]], "versions": VERSIONS,
    })
    return rows


def write_latency(root: Path, hw: Hardware, specs: Sequence[tuple[int, float, int, int]],
                  seed: int = 0, predictor: bool = True) -> None:
    d = root / "latency" / hw.hardware_id
    _write_json(d / "hardware.json", hardware_json(hw))
    rng = np.random.default_rng(seed + 1)
    rows = []
    for h, v, lyr, _ in {(h, v, lyr, 1) for h, v, lyr, _ in specs}:
        ms = hw.draft_base_ms + hw.per_head_ms * h + hw.per_keep_ms * v
        rows.append({"hardware_id": hw.hardware_id, "kind": "draft",
                     "spec_id": spec_id(h, v, lyr, 1),
                     "heads": h, "visual_keep": v, "inject_layer": lyr, "context_len": 640, "k": 1,
                     "median_ms": round(ms, 4), "p10_ms": round(ms * 0.97, 4),
                     "p90_ms": round(ms * 1.05, 4), "n_samples": 30, "throttled": 0,
                     "status": "ok", "timestamp": hw.created})
    _write_csv(d / "profile.csv", list(rows[0]), rows)
    if not predictor:
        return
    holdout = []
    for row in rows[:: max(1, len(rows) // 24)]:
        noise = float(rng.normal(0.0, 0.045))
        holdout.append({"kind": "draft", "spec_id": row["spec_id"], "context_len": 640, "k": 1,
                        "measured_ms": row["median_ms"],
                        "predicted_ms": round(row["median_ms"] * (1 + noise), 4)})
    for k in range(2, 9):
        ms = hw.decode_ms * (1 + hw.verify_slope * (k - 1))
        holdout.append({"kind": "verify", "spec_id": None, "context_len": 640, "k": k,
                        "measured_ms": round(ms, 4),
                        "predicted_ms": round(ms * (1 + float(rng.normal(0, 0.02))), 4)})
    errs = [abs(p["predicted_ms"] - p["measured_ms"]) / p["measured_ms"] for p in holdout]
    by_kind = {}
    for kind in ("draft", "verify"):
        rel = [e for e, p in zip(errs, holdout, strict=True) if p["kind"] == kind]
        by_kind[kind] = {"mape": round(float(np.mean(rel)), 5), "rmse": 0.1,
                         "within_10pct": round(float(np.mean([e <= 0.1 for e in rel])), 4),
                         "kendall_tau": None if kind == "verify" else 0.9, "n": len(rel)}
    _write_json(d / "predictor.json", {
        "hardware_id": hw.hardware_id, "regressor": "GradientBoostingRegressor",
        "cv_scores": {"Ridge": -0.142, "RandomForestRegressor": -0.061,
                      "GradientBoostingRegressor": -0.048},
        "metrics": {"mape": round(float(np.mean(errs)), 5), "rmse": 0.213,
                    "within_10pct": round(float(np.mean([e <= 0.1 for e in errs])), 4),
                    "kendall_tau": 0.912},
        "metrics_by_kind": by_kind,
        "holdout": holdout, "n_train": 3 * len(holdout), "n_holdout": len(holdout),
        "versions": VERSIONS,
    })


def write_acceptance(root: Path, specs: Sequence[tuple[int, float, int, int]],
                     dataset_id: str = "builtin-eval") -> None:
    rows = []
    for h, v, lyr, g in specs:
        rates = accept_rates(h, v, lyr, g)
        tau = tau_of(rates)
        row = {"supernet_hash": SUPERNET_HASH, "dataset_id": dataset_id,
               "spec_id": spec_id(h, v, lyr, g), "heads": h, "visual_keep": v, "inject_layer": lyr,
               "draft_len": g, "temperature": 0.0, "method": "teacher-forced",
               "tau": round(tau, 6), "tau_lo": round(tau * 0.96, 6), "tau_hi": round(tau * 1.04, 6),
               "n_prompts": 64, "n_tokens": 4096, "context_len": 640}
        # Unconditional per-position rate: P(draft token i accepted).
        alive = 1.0
        for i, r in enumerate(rates, start=1):
            alive *= r
            row[f"accept_rate_{i}"] = round(alive, 6)
        rows.append(row)
    _write_csv(root / "acceptance" / f"{dataset_id}.csv", ACCEPT_COLUMNS, rows)


def training_block(warmup: int = 300, stop: int = 700, every: int = 50) -> dict[str, Any]:
    """run.json's supernet `train` block of a run that stopped at a plateau: a loss falling
    per step, held-out tau rising to the plateau, the kept evaluation."""
    curve = [{"step": s, "phase": 1 if s <= warmup else 2,
              "loss": round(0.15 + 2.5 * math.exp(-s / 80.0), 6)} for s in range(1, stop + 1)]
    evals = []
    for s in range(every, stop + 1, every):
        full = round(5.5 - 2.5 * math.exp(-s / 120.0), 4)
        row: dict[str, Any] = {"step": s, "phase": 1 if s <= warmup else 2, "tau_full": full}
        if s > warmup:
            small = round(full - 0.6 * math.exp(-(s - warmup) / 60.0) - 0.2, 4)
            row.update(tau_smallest=small, score=round((full + small) / 2, 4))
        evals.append(row)
    best = max((e for e in evals if "score" in e), key=lambda e: e["score"])
    return {"warmup_steps": warmup, "multires_steps": 900, "loss_curve": curve,
            "convergence": {"evals": evals, "best_step": best["step"], "best": best,
                            "stopped": "plateau", "steps": stop, "draft_len": 7}}


def write_run_json(root: Path, space: Space, aifd: bool = True) -> None:
    layers = list(range(1, 17))
    # Entropy falls with depth, flattens in the upper-middle layers, rises again at the top.
    ae = [round(4.1 - 1.9 * (1 - math.exp(-i / 4.0)) + 0.012 * max(0, i - 12) ** 2, 4)
          for i in layers]
    delta = [0.0] + [round(b - a, 4) for a, b in zip(ae, ae[1:], strict=False)]
    data: dict[str, Any] = {
        "target": {"id": "builtin", "path": "/root/.cache/dreams-nas/built-in target",
                   "family": "llava", "num_layers": 16, "hidden_size": 192},
        "space": space.to_dict(),
        "supernet": {"hash": SUPERNET_HASH,
                     "config": {"hidden_size": 192, "num_attention_heads": 8},
                     "num_params": draft_params(8),
                     "train": training_block()},
        "versions": VERSIONS, "schema_version": 1, "a_key_from_a_newer_writer": {"x": 1},
    }
    if aifd:
        data["aifd"] = {"layers": layers, "ae": ae, "delta_ae": delta, "chosen": [12],
                        "rule": "lowest AE among layers whose |ΔAE| is below the median"}
    _write_json(root / "run.json", data)


def make_run(root: Path, *, hardware: Sequence[Hardware] = (CPU,), space: Space | None = None,
             optuna: bool = False, aifd: bool = True, predictor: bool = True,
             measured: bool = True, acceptance: bool = True, extra_columns: bool = False,
             max_draft_ms: float | None = None) -> Path:
    """Write a complete run folder under `root` and return it."""
    space = space or Space()
    specs = space.specs()
    root.mkdir(parents=True, exist_ok=True)
    write_run_json(root, space, aifd=aifd)
    if acceptance:
        write_acceptance(root, specs)
    for i, hw in enumerate(hardware):
        write_latency(root, hw, specs, seed=i, predictor=predictor)
        write_search(root, hw, specs, optuna=optuna, seed=i, measured=measured,
                     extra_columns=extra_columns, max_draft_ms=max_draft_ms)
    return root


def make_single_subnet_run(root: Path) -> Path:
    """A run whose space holds one subnet (the smallest possible search)."""
    return make_run(root, space=Space(heads=(4,), visual_keep=(0.5,), inject_layer=(12,),
                                      draft_len=(3,)), aifd=False, predictor=False)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


SIZED_LAYER = 16  # make_sized: the subnets injecting this layer get depth 2 and half the MLP


def make_sized(run: Path) -> Path:
    """`run` (a `make_run` folder) as a search over draft sizes would have written it: trials.csv
    and pareto.csv gain `depth` and `mlp` after `tree`, the subnets injecting SIZED_LAYER become
    depth 2 with half the MLP (their ids gain ``-d2-m0.50``, in every file that names them and
    in their spec folders), every other subnet is depth 1 with the whole MLP."""
    old, new = f"-l{SIZED_LAYER}-", f"-l{SIZED_LAYER}-d2-m0.50-"
    for path in [*run.glob("search/*/*.csv"), *run.glob("search/*/best.json"),
                 *run.glob("acceptance/*.csv")]:
        path.write_text(path.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
    for folder in list(run.glob(f"specs/*{old}*")):
        folder.rename(folder.with_name(folder.name.replace(old, new)))
    for path in [*run.glob("search/*/trials.csv"), *run.glob("search/*/pareto.csv")]:
        rows = read_rows(path)
        names = list(rows[0])
        at = names.index("tree") + 1 if "tree" in names else names.index("draft_len") + 1
        names[at:at] = ["depth", "mlp"]
        for row in rows:
            sized = new in row["spec_id"]
            row["depth"], row["mlp"] = (2, 0.5) if sized else (1, 1.0)
        _write_csv(path, names, rows)
    for path in run.glob("search/*/best.json"):
        best = json.loads(path.read_text(encoding="utf-8"))
        if new in best["spec_id"]:
            best["spec"].update(depth=2, mlp=0.5)
        _write_json(path, best)
    return run


VOCAB_HEADS = 4  # make_vocab: subnets of this many heads draft over a quarter of the vocabulary


def make_vocab(run: Path) -> Path:
    """`run` (a `make_run` or `make_sized` folder) as a search over draft vocabularies would have
    written it: trials.csv and pareto.csv gain `draft_vocab` after `mlp` (after `tree` or
    `draft_len` without one), the subnets of VOCAB_HEADS heads draft over a quarter of the
    vocabulary (their ids gain ``-n0.25`` before the shape, in every file that names them and in
    their spec folders), every other subnet over the whole one."""
    pattern = re.compile(rf"\b(h{VOCAB_HEADS}-v[0-9.]+-l\d+(?:-d\d+)?(?:-m[0-9.]+)?)-([gt])")
    tagged = lambda text: pattern.sub(r"\1-n0.25-\2", text)  # noqa: E731
    for path in [*run.glob("search/*/*.csv"), *run.glob("search/*/best.json"),
                 *run.glob("acceptance/*.csv")]:
        path.write_text(tagged(path.read_text(encoding="utf-8")), encoding="utf-8")
    for folder in list(run.glob("specs/*")):
        if tagged(folder.name) != folder.name:
            folder.rename(folder.with_name(tagged(folder.name)))
    for path in [*run.glob("search/*/trials.csv"), *run.glob("search/*/pareto.csv")]:
        rows = read_rows(path)
        names = list(rows[0])
        after = next(n for n in ("mlp", "tree", "draft_len") if n in names)
        names.insert(names.index(after) + 1, "draft_vocab")
        for row in rows:
            row["draft_vocab"] = 0.25 if "-n0.25-" in row["spec_id"] else 1.0
        _write_csv(path, names, rows)
    for path in run.glob("search/*/best.json"):
        best = json.loads(path.read_text(encoding="utf-8"))
        if "-n0.25-" in best["spec_id"]:
            best["spec"].update(draft_vocab=0.25)
        _write_json(path, best)
    return run
