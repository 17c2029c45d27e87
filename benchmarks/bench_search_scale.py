"""The search at 10^6 subnets: exhaustive evaluation + Pareto front, and the 2-D front alone.

    .venv/bin/python benchmarks/bench_search_scale.py                 # 10^6 subnets, 1 thread
    .venv/bin/python benchmarks/bench_search_scale.py --subnets 100000 --old-points 5000

A synthetic table of subnets with recorded shapes: tau grows with heads, visual_keep and draft_len
(diminishing returns, noise), clipped to [1, draft_len + 1]; latencies from the real
`LatencyPredictor` fitted on synthetic profile rows (draft step linear in heads and visual
tokens, a colder first step, a verify pass growing slowly with k).

Parts, each in its own process (so each peak RSS, `ru_maxrss`, is its own), medians of
`--repeats`:

* ``exhaustive_arrays``: `evaluate_fields` over every subnet (a fresh `MemoizedLatency` each
  repeat, so the three predictor calls are timed too), the Pareto front of the feasible ones
  in (speedup max, draft parameters min) and the best. This is the vectorised path `evaluate`
  runs; the subnets are numpy columns (`SubnetFields`), never 10^6 objects.
* ``exhaustive_objects``: `search(...)` itself on 10^6 `AcceptanceRow` objects served by
  `RecordedAcceptance` (spec objects, candidate objects and all); the table's construction is
  not timed. Skipped with ``--no-objects``.
* ``pareto_2d``: `is_pareto_front` of 10^6 uniform random 2-D points.
* ``old_vs_new``: the pre-#17 pairwise front (kept below, verbatim) against the new one on the
  same `--old-points` random points with ties.
* ``report``: the HTML report of a 10^6-subnet search. A run folder written by the project's
  own writers (`search(...)` on the synthetic table as in ``exhaustive_objects``, then
  `export_result`: trials.csv, pareto.csv, best.json, specs/ of the front), then
  `write_report` in a process of its own (its wall time and peak RSS), the page's size, and
  the time headless Chromium takes to open it until the load event has fired, two frames
  have been drawn and every figure holds drawn elements (median of 3 opens, a fresh browser
  each, its start not counted; tests/reports/browser.py drives it). Skipped with
  ``--no-report``; needs `chromium` (``apt-get install -y chromium``).

Targets (issue #17): exhaustive over 10^6 <= 60 s at peak RSS <= 4 GB; 2-D Pareto of 10^6
points <= 5 s; the report of the 10^6-subnet search opens in headless Chromium in <= 5 s and
weighs <= 5 MB. Prints one JSON line; exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HEADS = tuple(range(1, 51))  # 50
VISUAL_KEEP = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 20
DRAFT_LEN = tuple(range(1, 11))  # 10: with 100 inject layers, 10^6 subnets
CONTEXT = 640
HARDWARE_ID = "cpu-synthetic-1t"
ROOT = Path(__file__).resolve().parent.parent
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


# --- the synthetic table --------------------------------------------------------------------
def space_of(subnets: int):
    from dreams_nas.supernet.core.space import SearchSpace

    layers = max(1, subnets // (len(HEADS) * len(VISUAL_KEEP) * len(DRAFT_LEN)))
    return SearchSpace(heads=HEADS, visual_keep=VISUAL_KEEP, inject_layer=tuple(range(layers)),
                       draft_len=DRAFT_LEN)


def fields_of(space):
    """The space's subnets as columns, in `SearchSpace.enumerate` order."""
    from dreams_nas.nas.search.candidate import SubnetFields

    grids = np.meshgrid(np.array(space.heads), np.array(space.visual_keep),
                        np.array(space.inject_layer), np.array(space.draft_len), indexing="ij")
    h, v, lyr, g = (grid.ravel() for grid in grids)
    return SubnetFields(heads=h, visual_keep=v, inject_layer=lyr, draft_len=g)


def tau_of(fields, seed: int = 0) -> np.ndarray:
    """Recorded shapes: per-position acceptance rises with heads, visual tokens and mid-deep
    features, decays along the draft; tau = 1 + sum of the cumulative products; noise;
    clipped to [1, draft_len + 1]."""
    rng = np.random.default_rng(seed)
    depth = fields.inject_layer / max(1, int(fields.inject_layer.max()))
    a0 = (0.45 + 0.25 * (1 - np.exp(-fields.heads / 12)) + 0.12 * np.sqrt(fields.visual_keep)
          + 0.10 * (1 - (depth - 0.8) ** 2))  # (n,)
    a0 = np.clip(a0, 0.01, 0.99)
    tau = np.ones(len(fields))
    run = np.ones(len(fields))
    for j in range(int(fields.draft_len.max())):
        run = run * np.clip(a0 * 0.96**j, 0.01, 0.99)
        tau += np.where(fields.draft_len > j, run, 0.0)
    tau += rng.normal(0.0, 0.05, len(fields))
    return np.clip(tau, 1.0, fields.draft_len + 1.0)


def draft_params_of(heads: np.ndarray) -> np.ndarray:
    """Parameters of an extracted draft: attention grows with heads (the cost axis)."""
    return (2_000_000 + 250_000 * heads).astype(np.int64)


def fitted_predictor():
    """The real predictor, fitted on synthetic profile rows of a coarse grid."""
    import pandas as pd
    from dreams_nas.latency.model.predictor import LatencyPredictor

    rows = []
    for ctx in (320, 640, 960):
        for h in HEADS[::7]:
            for v in VISUAL_KEEP[::4]:
                draft = 0.4 + 0.045 * h + 0.9 * v + 0.0004 * ctx
                rows.append({"kind": "draft", "heads": h, "visual_keep": v, "context_len": ctx,
                             "k": 1, "median_ms": draft})
                rows.append({"kind": "draft_first", "heads": h, "visual_keep": v,
                             "context_len": ctx, "k": 1, "median_ms": 1.6 * draft})
        for k in range(1, max(DRAFT_LEN) + 2):
            rows.append({"kind": "decode" if k == 1 else "verify", "heads": np.nan,
                         "visual_keep": np.nan, "context_len": ctx, "k": k,
                         "median_ms": 18.0 + 1.2 * k + 0.002 * ctx})
    return LatencyPredictor.fit(pd.DataFrame(rows), "synthetic", holdout=0.0)


# --- the pre-#17 front, verbatim: the baseline of the ratio ---------------------------------
def old_is_pareto_front(values: np.ndarray, directions: Sequence[str]) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, dtype=bool)
    sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
    loss = arr * sign  # (n, m)
    valid = ~np.isnan(loss).any(axis=1)  # (n,)
    others = loss[valid]  # (k, m)
    on_front = np.zeros(n, dtype=bool)
    for start in range(0, n, 1024):
        block = loss[start : start + 1024]  # (b, m)
        no_worse = (others[None, :, :] <= block[:, None, :]).all(axis=2)  # (b, k)
        better = (others[None, :, :] < block[:, None, :]).any(axis=2)  # (b, k)
        dominated = (no_worse & better).any(axis=1)  # (b,)
        on_front[start : start + 1024] = ~dominated
    return on_front & valid


# --- the parts ------------------------------------------------------------------------------
def _median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times, out


def part_exhaustive_arrays(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.latency.model.query import MemoizedLatency
    from dreams_nas.nas.search.candidate import DraftCost, Pricing, evaluate_fields
    from dreams_nas.supernet.core.pareto import is_pareto_front

    space = space_of(args.subnets)
    start = time.perf_counter()
    fields, predictor = fields_of(space), fitted_predictor()
    tau = tau_of(fields)
    params = draft_params_of(fields.heads)
    build_s = time.perf_counter() - start
    calls: list[int] = []

    def run() -> tuple[int, int]:
        cache = MemoizedLatency(predictor)
        arrays = evaluate_fields(tau, fields, Pricing(cache, CONTEXT, DraftCost(lambda _: 0)),
                                 max_draft_ms=args.max_draft_ms)
        calls.append(cache.n_calls)
        feasible = np.flatnonzero(arrays.feasible)
        values = np.stack([arrays.speedup[feasible], params[feasible]], axis=1)  # (f, 2)
        front = feasible[is_pareto_front(values, ("maximize", "minimize"))]
        best = feasible[np.lexsort((params[feasible], -arrays.speedup[feasible]))[0]]
        return int(front.size), int(best)

    median, times, (front, best) = _median_time(run, args.repeats)
    return {"subnets": len(fields), "median_s": median, "times_s": times, "build_s": build_s,
            "predictor_calls": calls[-1], "front_size": front,
            "best": space_spec_id(fields, best)}


def space_spec_id(fields, i: int) -> str:
    from dreams_nas.supernet.core.spec import SubnetSpec

    return SubnetSpec(heads=int(fields.heads[i]), visual_keep=float(fields.visual_keep[i]),
                      inject_layer=int(fields.inject_layer[i]),
                      draft_len=int(fields.draft_len[i])).id


def part_exhaustive_objects(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.nas.search.candidate import DraftCost, Pricing
    from dreams_nas.nas.search.config import SearchConfig
    from dreams_nas.nas.search.replay import RecordedAcceptance
    from dreams_nas.nas.search.strategies import search
    from dreams_nas.supernet.acceptance.table import AcceptanceRow

    space = space_of(args.subnets)
    start = time.perf_counter()
    fields, predictor = fields_of(space), fitted_predictor()
    tau = tau_of(fields).tolist()
    rows = [AcceptanceRow(spec=spec, tau=t, tau_lo=t, tau_hi=t, supernet_hash="synthetic",
                          dataset_id="synthetic")
            for spec, t in zip(space.enumerate(), tau, strict=True)]
    del fields, tau
    build_s = time.perf_counter() - start

    def params(spec) -> int:
        return 2_000_000 + 250_000 * spec.heads

    def run():
        result = search(space, RecordedAcceptance(rows), Pricing(predictor, CONTEXT,
                                                                   DraftCost(params)),
                        SearchConfig(max_draft_ms=args.max_draft_ms, show_progress=False))
        return len(result.front), result.best.spec.id

    median, times, (front, best) = _median_time(run, args.repeats)
    return {"subnets": len(rows), "median_s": median, "times_s": times, "build_s": build_s,
            "front_size": front, "best": best}


def part_pareto_2d(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.supernet.core.pareto import is_pareto_front

    values = np.random.default_rng(1).random((args.points, 2))
    median, times, mask = _median_time(
        lambda: is_pareto_front(values, ("maximize", "minimize")), args.repeats)
    return {"points": args.points, "median_s": median, "times_s": times,
            "front_size": int(mask.sum())}


def part_old_vs_new(args: argparse.Namespace) -> dict[str, Any]:
    from dreams_nas.supernet.core.pareto import is_pareto_front

    directions = ("maximize", "minimize")
    # rounded: ties and duplicates, as speedups and parameter counts have
    values = np.round(np.random.default_rng(2).random((args.old_points, 2)), 3)
    old, old_times, old_mask = _median_time(
        lambda: old_is_pareto_front(values, directions), args.repeats)
    new, new_times, new_mask = _median_time(
        lambda: is_pareto_front(values, directions), args.repeats)
    if old_mask.tolist() != new_mask.tolist():
        raise SystemExit("the new front differs from the old one")
    return {"points": args.old_points, "old_median_s": old, "new_median_s": new,
            "old_times_s": old_times, "new_times_s": new_times, "speedup_x": old / new,
            "front_size": int(new_mask.sum())}


def write_search_run(run_dir: Path, subnets: int, max_draft_ms: float) -> dict[str, Any]:
    """A run folder holding an exhaustive search of the synthetic table, written as
    `dreams-nas search` writes one: `search(...)` (the real evaluate path) then `export_result`.
    Returns the seconds each step took and the search's sizes."""
    from dreams_nas.nas.search.candidate import DraftCost, Pricing
    from dreams_nas.nas.search.config import SearchConfig
    from dreams_nas.nas.search.replay import RecordedAcceptance
    from dreams_nas.nas.search.strategies import search
    from dreams_nas.nas.stages.export import SearchRecord, export_result
    from dreams_nas.supernet.acceptance.table import AcceptanceRow
    from dreams_nas.supernet.core.runfolder import RunFolder

    times: dict[str, float] = {}
    start = time.perf_counter()
    space = space_of(subnets)
    fields, predictor = fields_of(space), fitted_predictor()
    tau = tau_of(fields)
    lo = np.maximum(1.0, tau - 0.04 * tau).tolist()
    hi = np.minimum(fields.draft_len + 1.0, tau + 0.04 * tau).tolist()
    rows = [AcceptanceRow(spec=spec, tau=t, tau_lo=a, tau_hi=b, supernet_hash="synthetic",
                          dataset_id="synthetic")
            for spec, t, a, b in zip(space.enumerate(), tau.tolist(), lo, hi, strict=True)]
    del fields, tau, lo, hi
    times["table_s"] = time.perf_counter() - start

    start = time.perf_counter()
    def params(spec) -> int:
        return 2_000_000 + 250_000 * spec.heads

    def memory(spec) -> int:  # fp16 weights + 2 layers' KV + the memory (576 visual tokens)
        kv = 2 * spec.heads * 64 * (2 * CONTEXT + round(CONTEXT - 576 * (1 - spec.visual_keep)))
        return 2 * (params(spec) + kv)

    result = search(space, RecordedAcceptance(rows),
                    Pricing(predictor, CONTEXT, DraftCost(params, memory)),
                    SearchConfig(max_draft_ms=max_draft_ms, show_progress=False))
    times["search_s"] = time.perf_counter() - start
    del rows

    start = time.perf_counter()
    hardware = {"hardware_id": HARDWARE_ID, "kind": "cpu", "name": "synthetic", "threads": 1,
                "dtype": "float32"}
    export_result(RunFolder(run_dir), result,
                  SearchRecord(HARDWARE_ID, hardware, "synthetic", "float32",
                               target={"id": "synthetic"}))
    times["export_s"] = time.perf_counter() - start
    trials = run_dir / "search" / HARDWARE_ID / "trials.csv"
    return {**times, "subnets": len(result.candidates), "front_size": len(result.front),
            "best": result.best.spec.id, "trials_csv_mb": trials.stat().st_size / 1e6}


def part_report_render(args: argparse.Namespace) -> dict[str, Any]:
    """`write_report` of `--report-run` (the process is this step's alone: its peak RSS)."""
    from dreams_nas.reports import write_report

    start = time.perf_counter()
    page = write_report(args.report_run)
    return {"page": str(page), "generate_s": time.perf_counter() - start}


# Figures drawn: every inline figure has a size and drawn elements.
FIGURES_DRAWN = """Array.from(document.querySelectorAll("figure svg.fig")).filter(e => {
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && e.querySelectorAll("path, use, text").length > 10;
}).length"""


def open_in_chromium(page: Path, repeats: int) -> dict[str, Any]:
    """Seconds from navigating to `page` until it is loaded and its figures drawn, in a fresh
    headless Chromium each time (its start not counted)."""
    sys.path.insert(0, str(ROOT / "tests" / "reports"))
    from browser import Browser, find_chromium  # tests/reports/browser.py

    exe = find_chromium()
    if exe is None:
        raise SystemExit("the report part needs chromium (apt-get install -y chromium); "
                         "or pass --no-report")
    times, drawn, elements, errors = [], 0, 0, []
    for i in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-chromium-") as profile, \
                Browser(exe, Path(profile) / f"profile-{i}") as browser:
            start = time.perf_counter()
            browser.open(page)  # the load event, then two animation frames
            drawn = browser.evaluate(FIGURES_DRAWN)
            times.append(time.perf_counter() - start)
            elements = browser.evaluate("document.getElementsByTagName('*').length")
            errors += browser.errors
    figures = page.read_text(encoding="utf-8").count('<svg class="fig"')
    if drawn != figures or errors:
        raise SystemExit(f"{page}: {drawn} of {figures} figures drawn; errors: {errors}")
    return {"open_median_s": statistics.median(times), "open_times_s": times,
            "figures_drawn": drawn, "elements": elements}


def part_report(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        run_dir = Path(tmp) / "run"
        build = write_search_run(run_dir, args.subnets, args.max_draft_ms)
        render = _run_part("report_render", [*_passed(args), "--report-run", str(run_dir)],
                           args.threads)
        page = Path(render["page"])
        figures = page.parent / "report_figures"
        return {"build": build, "generate_s": render["generate_s"],
                "generate_peak_rss_gb": render["peak_rss_gb"],
                "html_bytes": page.stat().st_size,
                "figure_copies_bytes": sum(p.stat().st_size for p in figures.iterdir()),
                **open_in_chromium(page, args.opens)}


PARTS = {"exhaustive_arrays": part_exhaustive_arrays,
         "exhaustive_objects": part_exhaustive_objects,
         "pareto_2d": part_pareto_2d, "old_vs_new": part_old_vs_new, "report": part_report,
         "report_render": part_report_render}
TOP_PARTS = ("exhaustive_arrays", "exhaustive_objects", "pareto_2d", "old_vs_new", "report")


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def _run_part(name: str, argv: Sequence[str], threads: int) -> dict[str, Any]:
    """One part in a fresh process with `threads` BLAS/OpenMP threads; its JSON line back."""
    env = {**os.environ, **{var: str(threads) for var in THREAD_VARS}}
    out = subprocess.run([sys.executable, __file__, *argv, "--part", name], env=env,
                         check=True, stdout=subprocess.PIPE, text=True)  # its stderr is ours
    return json.loads(out.stdout.strip().splitlines()[-1])


def _passed(args: argparse.Namespace) -> list[str]:
    """The options of this run, for a part's own process."""
    return [f"--{name.replace('_', '-')}={getattr(args, name)}"
            for name in ("subnets", "points", "old_points", "repeats", "threads", "max_draft_ms",
                         "opens")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subnets", type=int, default=1_000_000)
    parser.add_argument("--points", type=int, default=1_000_000, help="2-D Pareto points")
    parser.add_argument("--old-points", type=int, default=20_000,
                        help="points for the old-vs-new ratio (the old front is O(n^2))")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-draft-ms", type=float, default=2.5)
    parser.add_argument("--opens", type=int, default=3,
                        help="headless Chromium opens of the report (median)")
    parser.add_argument("--no-objects", action="store_true",
                        help="skip the object path (search() on AcceptanceRow objects)")
    parser.add_argument("--no-report", action="store_true",
                        help="skip the report of the 10^6-subnet search")
    parser.add_argument("--part", choices=sorted(PARTS), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--report-run", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part is not None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=args.threads):
            figures = PARTS[args.part](args)
        print(json.dumps({**figures, "peak_rss_gb": _peak_rss_gb()}))
        return 0
    skip = {"exhaustive_objects": args.no_objects, "report": args.no_report}
    names = [n for n in TOP_PARTS if not skip.get(n)]
    results = {name: _run_part(name, _passed(args), args.threads) for name in names}
    exhaustive = results["exhaustive_arrays"]
    targets = {
        "exhaustive_le_60s": exhaustive["median_s"] <= 60.0,
        "exhaustive_rss_le_4gb": exhaustive["peak_rss_gb"] <= 4.0,
        "pareto_2d_le_5s": results["pareto_2d"]["median_s"] <= 5.0,
    }
    if "report" in results:
        targets["report_open_le_5s"] = results["report"]["open_median_s"] <= 5.0
        targets["report_le_5mb"] = results["report"]["html_bytes"] <= 5_000_000
    print(json.dumps({"threads": args.threads, "repeats": args.repeats, **results,
                      "targets": targets, "pass": all(targets.values())}))
    return 0 if all(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
