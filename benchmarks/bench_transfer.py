"""Few-shot latency transfer between the devices this machine offers: each ordered pair, each
budget N, against the target device's own full profile.

    dreams-nas train --run <base> && dreams-nas score --run <base>
    python benchmarks/bench_transfer.py --base <base> --work <dir> \\
        --device 1t-float32 --device 2t-float32 --budgets 5 10 20 \\
        [--repeats 40 --passes 4] [--measure --prompts 16 --measure-repeats 3] [--json FILE]

A device is `<threads>t-<dtype>`. For each, a copy of the base run (its supernet and acceptance
rows; for a dtype other than the base's, the copy's run.json says that dtype and the acceptance
is scored again in it) is profiled in full with `dreams-nas profile`, wall time measured
around the command, and searched exhaustively (`dreams-nas search --method exhaustive
--verify 0`). Then for every ordered pair (source, target) and budget N, a fresh copy of the
target's run is profiled with `--transfer-from <source's full profile> --budget N` (a pair of
two dtypes is refused, by design: the refusal is recorded) and searched the same way.

Reported per transfer: its wall time against the full profile's; MAPE, share within 10 % and
Kendall's tau of the transferred predictor against every row of the target's full profile (p10,
what the predictor fits), tau against the full profile's own predictor on those rows (the
prices a search gets from a full profile, without the rows' noise), and tau among the draft
steps (the ranking the search needs); the pick and its predicted speedup; the speedup ranking
of every subnet against the full profile's search. The transfer's map is also refitted on the
same measured rows with each level set (global; engines; kinds) and on the full profile's rows
at the same steps (the model's error without the drift between the runs). `--measure` decodes,
per target device, the distinct picks (the full profile's first) end to end at that device's
threads and dtype, interleaved prompt by prompt (`nas.stages.verify.measure_end_to_end`, decode
phase, medians over the repeats): each transferred pick's speedup over the full profile's pick.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEEP = ("run.json", "supernet", "acceptance")  # what a device's run copies from the base


def _cli(*args: str) -> tuple[int, dict[str, Any], float, str]:
    """`dreams-nas ARGS --json` in a subprocess: (exit code, its summary, wall s, stderr tail)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dreams_nas.nas.cli", *args, "--json"],
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines and done.returncode == 0 else {}
    errors = done.stderr.strip().splitlines()
    return done.returncode, summary, wall, errors[-1] if errors else ""


def _copy_run(base: Path, dest: Path, dtype: str | None = None) -> Path:
    """A run folder with the base's supernet and acceptance rows (run.json in `dtype`)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in KEEP:
        src = base / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    if dtype is not None:
        meta = json.loads((dest / "run.json").read_text())
        if meta.get("dtype") != dtype:
            meta["dtype"] = dtype
            (dest / "run.json").write_text(json.dumps(meta, indent=1))
            shutil.rmtree(dest / "acceptance", ignore_errors=True)
    return dest


def _device(label: str) -> tuple[int, str]:
    threads, _, dtype = label.partition("t-")
    return int(threads), dtype


def _profile(run: Path, label: str, timing: list[str], *extra: str) -> dict[str, Any]:
    threads, dtype = _device(label)
    code, summary, wall, err = _cli("profile", "--run", str(run), "--device", "cpu",
                                    "--threads", str(threads), "--dtype", dtype, *timing, *extra)
    return {"code": code, "wall_s": round(wall, 1), "error": err if code else "", **summary}


def _search(run: Path, hardware_id: str) -> dict[str, Any]:
    code, summary, _, err = _cli("search", "--run", str(run), "--hardware", hardware_id,
                                 "--method", "exhaustive", "--verify", "0", "--quiet")
    best = json.loads((run / "search" / hardware_id / "best.json").read_text()) if code == 0 \
        else {}
    return {"pick": best.get("spec_id"), "predicted": (best.get("predicted") or {}).get("speedup"),
            "error": err if code else ""}


def _p10_rows(folder: Path) -> Any:
    """The ok rows of the profile in `folder`, their p10 as `median_ms` (what a profile fits)."""
    from dreams_nas.latency.measure.profile_store import ProfileStore
    from dreams_nas.latency.model.persist import training_frame

    return training_frame(ProfileStore(folder / "profile.csv").ok_rows()
                          .assign(median_ms=lambda f: f["p10_ms"]), "p10_ms")


def _accuracy(folder: Path, truth: Path, levels_from: Path | None = None) -> dict[str, Any]:
    """The predictor in `folder` against every ok row of the full profile in `truth` (p10)."""
    from dreams_nas.latency.model.draft_regression import latency_metrics
    from dreams_nas.latency.model.predictor import LatencyPredictor

    rows = _p10_rows(truth)
    measured = rows["median_ms"].to_numpy(dtype=float)
    predicted = LatencyPredictor.load(folder).predict_rows(rows)
    out = latency_metrics(measured, predicted)
    drafts = ((rows["kind"] == "draft") & (rows["k"] == 1)).to_numpy()
    out["draft_tau"] = latency_metrics(measured[drafts], predicted[drafts])["kendall_tau"]
    # against the prices a full profile gives the search: its own predictor on the same rows
    full = LatencyPredictor.load(truth).predict_rows(rows)
    versus = latency_metrics(full, predicted)
    out["vs_predictor"] = {"mape": round(versus["mape"], 4),
                           "tau": round(versus["kendall_tau"], 4),
                           "draft_tau": round(latency_metrics(full[drafts], predicted[drafts])
                                              ["kendall_tau"], 4)}
    if levels_from is not None:
        out["levels"] = _levels(folder, levels_from, rows, measured)
    return {k: round(float(v), 4) if not isinstance(v, dict) else v for k, v in out.items()}


def _levels(folder: Path, source: Path, rows: Any, measured: Any) -> dict[str, Any]:
    """MAPE and draft tau of the transfer's map itself (the mapped grid, without the
    predictor's regression on top), refitted on the same measured rows with each level set
    and as chosen (`select_levels`); and, as `same_session`, chosen and fitted on the target's
    full-profile rows at the same steps: the model's error without the machine's drift between
    the full profile and the transfer."""
    import numpy as np
    from dreams_nas.latency.model.draft_regression import latency_metrics
    from dreams_nas.latency.model.predictor import LatencyPredictor
    from dreams_nas.latency.model.transfer import LatencyTransfer
    from dreams_nas.latency.model.validation import metric_kinds

    src = LatencyPredictor.load(source)
    here = _p10_rows(folder)
    kinds, cand_x = metric_kinds(rows), src.predict_rows(rows)[:, None]
    drafts = ((rows["kind"] == "draft") & (rows["k"] == 1)).to_numpy()
    keys = set(zip(here.kind, here.spec_id, here.context_len, here.k, strict=True))
    same = np.array([k in keys for k in zip(rows.kind, rows.spec_id, rows.context_len, rows.k,
                                              strict=True)])
    fits = {"same_session": (kinds[same], cand_x[same], measured[same], None)}
    fresh = (metric_kinds(here), src.predict_rows(here)[:, None],
             here["median_ms"].to_numpy(dtype=float))
    fits.update({name: (*fresh, levels) for name, levels in (
        ("global", ("global",)), ("engines", ("global", "engine")),
        ("kinds", ("global", "engine", "kind")), ("chosen", None))})
    out = {}
    for name, (k, x, y, levels) in fits.items():
        model = LatencyTransfer.fit(kinds, cand_x, k, x, y, levels)
        p = model.predict(kinds, cand_x)
        out[name] = {"mape": round(float(np.mean(np.abs(p - measured) / measured)), 4),
                     "tau": round(latency_metrics(measured, p)["kendall_tau"], 4),
                     "draft_tau": round(latency_metrics(measured[drafts], p[drafts])
                                        ["kendall_tau"], 4),
                     "levels": "+".join(model.design.levels)}
    return out


def _speedup_tau(run: Path, full_run: Path, hardware_id: str) -> float:
    """Kendall's tau between the predicted speedups of every subnet (trials.csv of the two
    exhaustive searches): how alike the transferred and the full profile rank the space."""
    import pandas as pd
    from scipy.stats import kendalltau

    a, b = (pd.read_csv(r / "search" / hardware_id / "trials.csv").set_index("spec_id")
            ["speedup"] for r in (run, full_run))
    joined = pd.concat([a, b], axis=1, keys=["transfer", "full"]).dropna()
    return round(float(kendalltau(joined["transfer"], joined["full"]).statistic), 4)


def _measure(run: Path, label: str, picks: list[str], prompts: int, repeats: int,
             max_new_tokens: int) -> dict[str, Any]:
    import torch
    from dreams_nas.nas.stages.inputs import RunModels, load_eval_examples
    from dreams_nas.nas.stages.verify import measure_end_to_end
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec

    threads, dtype = _device(label)
    specs = [SubnetSpec.from_id(p) for p in picks]
    with torch_threads(threads), torch.inference_mode():
        models = RunModels(RunFolder(run), "cpu", dtype)
        examples = load_eval_examples("builtin", prompts, 0)
        inputs = [models.target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
        measured = measure_end_to_end(models.target, models.draft, specs, inputs,
                                      max_new_tokens=max_new_tokens, repeats=repeats,
                                      show_progress=False)
    return {p: {"speedup": round(m.speedup, 4),
                "range": [round(min(m.repeat_speedups or (m.speedup,)), 4),
                          round(max(m.repeat_speedups or (m.speedup,)), 4)],
                "identical": f"{m.identical_prompts}/{m.prompts}"}
            for p, m in zip(picks, measured, strict=True)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    timing = ["--repeats", str(args.repeats), "--passes", str(args.passes)]
    base_dtype = json.loads((args.base / "run.json").read_text()).get("dtype", "float32")
    full: dict[str, dict[str, Any]] = {}
    for label in args.device:
        _, dtype = _device(label)
        folder = _copy_run(args.base, args.work / label / "full", dtype)
        if dtype != base_dtype:
            code, _, _, err = _cli("score", "--run", str(folder), "--quiet")
            if code:
                raise SystemExit(f"scoring {label} failed: {err}")
        profiled = _profile(folder, label, timing)
        hw = profiled["hardware_id"]
        own = folder / "latency" / hw
        full[label] = {"run": folder, "hardware_id": hw, "profile": profiled,
                       "search": _search(folder, hw), "own": _accuracy(own, own)}
        print(f"{label}: full profile {profiled['wall_s']} s, pick {full[label]['search']}",
              file=sys.stderr)
    transfers = []
    for (src, dst), n in itertools.product(itertools.permutations(args.device, 2), args.budgets):
        folder = _copy_run(full[dst]["run"], args.work / dst / f"from-{src}-n{n}")
        source = full[src]["run"] / "latency" / full[src]["hardware_id"]
        result = {"source": src, "target": dst, "n": n,
                  "profile": _profile(folder, dst, timing, "--transfer-from", str(source),
                                      "--budget", str(n))}
        if result["profile"]["code"] == 0:
            hw, truth = full[dst]["hardware_id"], full[dst]["run"] / "latency"
            result["accuracy"] = _accuracy(folder / "latency" / hw, truth / hw, source)
            result["search"] = _search(folder, hw)
            result["speedup_tau"] = _speedup_tau(folder, full[dst]["run"], hw)
        print(f"{src} -> {dst} N={n}: {json.dumps(result, default=str)[:300]}", file=sys.stderr)
        transfers.append(result)
    measured = {}
    if args.measure:
        for label, info in full.items():
            picks = [info["search"]["pick"], *(t["search"]["pick"] for t in transfers
                                               if t["target"] == label and "search" in t)]
            measured[label] = _measure(info["run"], label, list(dict.fromkeys(picks)),
                                       args.prompts, args.measure_repeats, args.max_new_tokens)
    return {"full": {k: {**v, "run": str(v["run"])} for k, v in full.items()},
            "transfers": transfers, "measured": measured}


def table(result: dict[str, Any]) -> list[str]:
    """The markdown table of BENCHMARKS.md."""
    lines = ["| source -> target | N | wall / full | MAPE (same session) | within 10 % | tau "
             "(same session) | tau vs its predictor | draft tau | speedup tau | pick | pick "
             "measured / full pick |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for t in result["transfers"]:
        full = result["full"][t["target"]]
        if t["profile"]["code"]:
            lines.append(f"| {t['source']} -> {t['target']} | {t['n']} | refused: "
                         f"{t['profile']['error'][:80]} |||||||||")
            continue
        a, pick = t["accuracy"], t["search"]["pick"]
        wall = t["profile"]["wall_s"] / full["profile"]["wall_s"]
        ratio = "-"
        speeds = result["measured"].get(t["target"], {})
        if pick in speeds and full["search"]["pick"] in speeds:
            ratio = f"{speeds[pick]['speedup'] / speeds[full['search']['pick']]['speedup']:.3f}"
        same = a["levels"]["same_session"]
        lines.append(f"| {t['source']} -> {t['target']} | {t['n']} | {wall:.3f} | "
                     f"{100 * a['mape']:.1f} % ({100 * same['mape']:.1f} %) | "
                     f"{100 * a['within_10pct']:.0f} % | {a['kendall_tau']:.3f} "
                     f"({same['tau']:.3f}) | {a['vs_predictor']['tau']:.3f} | "
                     f"{a['draft_tau']:.3f} | {t['speedup_tau']:.3f} | "
                     f"`{pick}` | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a trained and scored run")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the runs")
    parser.add_argument("--device", action="append", required=True, metavar="Nt-DTYPE")
    parser.add_argument("--budgets", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--measure-repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="write the whole result here")
    args = parser.parse_args(argv)
    if not (args.base / "supernet").is_dir() or not (args.base / "acceptance").is_dir():
        print(f"error: {args.base} is not a trained and scored run folder; run `dreams-nas "
              "train` and `dreams-nas score` first", file=sys.stderr)
        return 2
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print("\n".join(table(result)))
    for label, info in result["full"].items():
        own = info["own"]
        print(f"\n{label}: its own predictor on its own rows: MAPE {100 * own['mape']:.1f} %, "
              f"tau {own['kendall_tau']:.3f}, draft tau {own['draft_tau']:.3f}; full profile "
              f"{info['profile']['wall_s']} s, pick `{info['search']['pick']}`")
    for label, speeds in result["measured"].items():
        print(f"\n{label} measured: " + ", ".join(
            f"`{p}` {m['speedup']:.3f} ({m['range'][0]:.3f}-{m['range'][1]:.3f}, "
            f"{m['identical']} greedy)" for p, m in speeds.items()))
    summary = {"medians_by_n": {n: statistics.median(
        t["accuracy"]["draft_tau"] for t in result["transfers"]
        if t["n"] == n and "accuracy" in t) for n in args.budgets
        if any(t["n"] == n and "accuracy" in t for t in result["transfers"])}}
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
