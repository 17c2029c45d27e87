"""`dreams-nas search`: expected speedup of every subnet (or an Optuna study), Pareto front,
deployable specs, then the best subnets measured end to end."""

from __future__ import annotations

import argparse
import logging
from typing import Any

HELP = "search the subnets for the best expected speedup on one profiled hardware id"
log = logging.getLogger("dreams_nas")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objective", choices=("speedup", "pareto"), default="speedup",
                        help="speedup (maximise) or pareto (maximise speedup, minimise draft "
                             "parameters)")
    parser.add_argument("--method", choices=("exhaustive", "optuna"), default="exhaustive",
                        help="every subnet, or an Optuna TPE study")
    parser.add_argument("--trials", type=int, default=None, metavar="N",
                        help="optuna: distinct subnets to evaluate in the study, reruns and "
                             "workers together (default: a quarter of the space)")
    parser.add_argument("--storage", default=None, metavar="URL",
                        help="Optuna storage URL shared by workers, e.g. postgresql://... "
                             "(default: SQLite study.db in the run folder for optuna)")
    parser.add_argument("--study-name", default=None, metavar="NAME",
                        help="study name in the storage (default: derived from the run)")
    parser.add_argument("--hardware", default=None, metavar="ID",
                        help="hardware id whose latency profile to use (default: the only one)")
    parser.add_argument("--max-draft-ms", type=float, default=None, metavar="X",
                        help="constraint: a draft step must take at most X ms")
    parser.add_argument("--data", default="builtin", metavar="builtin|FILE.jsonl",
                        help="evaluation prompts whose acceptance is scored (as `score`)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="use the first N evaluation prompts (builtin default: 32)")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="tokens per prompt when scoring and verifying (default 64)")
    parser.add_argument("--verify", type=int, default=3, metavar="K",
                        help="measure the best subnet and the top K-1 of the front end to end "
                             "(0 skips it; default 3)")
    parser.add_argument("--verify-prompts", type=int, default=8, metavar="N",
                        help="evaluation prompts decoded for the verification (default 8)")
    parser.add_argument("--device", default="auto", metavar="D", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads while scoring missing rows (default: torch's "
                             "own); verification always uses the profiled thread count")


def _study_name(args: argparse.Namespace, hardware_id: str, data_id: str, digest: str) -> str:
    from dreams_nas.nas.search import default_study_name

    return f"{default_study_name(args.objective, args.max_draft_ms)}-{hardware_id}-{data_id}-{digest}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    import optuna
    from dreams_nas.nas.export import export_result
    from dreams_nas.nas.inputs import (
        LazyScorer,
        RunModels,
        context_len_of,
        dataset_id,
        draft_params_fn,
        hardware_identity,
        load_latency,
        resolve_hardware,
        supernet_hash,
        torch_threads,
    )
    from dreams_nas.nas.scoring import CachedAcceptance
    from dreams_nas.nas.search import search as _search
    from dreams_nas.supernet.acceptance_table import AcceptanceTable
    from dreams_nas.supernet.errors import InputError
    from dreams_nas.supernet.runfolder import RunFolder
    from dreams_nas.supernet.training_run import resolve_device

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says it all
    if args.trials is not None and args.trials < 1:
        raise InputError(f"--trials {args.trials} must be at least 1")
    if args.verify < 0 or args.verify_prompts < 1:
        raise InputError("--verify must be >= 0 and --verify-prompts >= 1")
    run_folder = RunFolder(args.run)
    hardware_id = resolve_hardware(run_folder, args.hardware)
    digest = supernet_hash(run_folder)
    space = run_folder.space()
    data_id = dataset_id(args.data, args.limit, args.seed)
    table = AcceptanceTable(run_folder.acceptance_csv(data_id), digest, data_id, 0.0)
    show = False if args.json or args.quiet else None
    models = RunModels(run_folder, str(resolve_device(args.device)))
    scorer = LazyScorer(models, data=args.data, limit=args.limit, seed=args.seed,
                        supernet_hash=digest, dataset_id=data_id,
                        max_new_tokens=args.max_new_tokens, draft_lens=space.draft_len,
                        show_progress=show)
    cached = CachedAcceptance(scorer, table)
    storage = args.storage
    if storage is None and args.method == "optuna":
        db = run_folder.study_db(hardware_id)
        db.parent.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{db.resolve()}"
    study_name = args.study_name or _study_name(args, hardware_id, data_id, digest)
    with torch_threads(args.threads):
        result = _search(
            space, cached, load_latency(run_folder, hardware_id), draft_params_fn(run_folder),
            context_len=context_len_of(table, scorer), objective=args.objective,
            method=args.method, max_draft_ms=args.max_draft_ms, n_trials=args.trials,
            storage=storage, study_name=study_name, seed=args.seed, show_progress=show,
        )
    if result.best is None:
        raise InputError(f"no subnet meets --max-draft-ms {args.max_draft_ms}; the fastest draft "
                         f"step is {min(c.draft_ms for c in result.candidates):.3f} ms: raise it")
    hardware = hardware_identity(run_folder, hardware_id)
    measured, verified, warnings = _verify(args, result, models, scorer, hardware)
    info = run_folder.read_run().get("target") or {}

    def write_draft(spec, folder):
        from dreams_nas.supernet.extract import extract

        extract(models.draft, spec).save_pretrained(folder)

    paths = export_result(run_folder, result, hardware_id=hardware_id, hardware=hardware,
                          target=info, supernet_hash=digest, write_draft=write_draft,
                          measured=measured, verified=verified)
    report = _write_report(run_folder, hardware_id)
    best = result.best
    summary: dict[str, Any] = {
        "hardware_id": hardware_id, "objective": result.objective, "method": result.method,
        "best": best.spec.id, "spec_dir": str(paths["spec_dir"]),
        "predicted": {"speedup": round(best.speedup, 4), "tau": round(best.tau, 4),
                      "draft_ms": round(best.draft_ms, 4), "verify_ms": round(best.verify_ms, 4),
                      "decode_ms": round(best.decode_ms, 4)},
        "measured": measured, "n_evaluations": result.n_evaluations,
        "space_size": result.space_size, "n_scored": result.n_scored,
        "front": [c.spec.id for c in result.front], "best_json": str(paths["best"]),
        "warnings": warnings,
    }
    if result.study_name:
        summary["study_name"] = result.study_name
        summary["storage"] = _redact(storage)
    if report:
        summary["report"] = report
    return summary


def _verify(args: argparse.Namespace, result: Any, models: Any, scorer: Any,
            hardware: dict[str, Any]) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    from dreams_nas.nas.verify import gap_warning, measure_end_to_end

    if args.verify == 0:
        return None, [], []
    here = models.device.split(":")[0]
    if hardware.get("kind") and hardware["kind"] != here:
        warning = (f"not verified: the latency profile is of a {hardware['kind']} device and this "
                   f"run decodes on {models.device}; run the search on the profiled machine")
        log.warning("warning: %s", warning)
        return None, [], [warning]
    chosen = [result.best] + [c for c in result.front if c.spec != result.best.spec]
    chosen = chosen[: args.verify]
    prompts = scorer.prompts[: args.verify_prompts]
    log.info("verifying %d subnet(s) end to end on %d prompts against plain decoding",
             len(chosen), len(prompts))
    from dreams_nas.nas.inputs import torch_threads

    threads = hardware.get("threads") if here == "cpu" else None
    with torch_threads(int(threads) if threads else None):  # the profile's setting
        results = measure_end_to_end(models.target, models.draft, [c.spec for c in chosen],
                                     prompts, max_new_tokens=args.max_new_tokens)
    verified, warnings = [], []
    for cand, m in zip(chosen, results, strict=True):
        verified.append({"spec_id": cand.spec.id, "predicted_speedup": cand.speedup,
                         "measured_speedup": m.speedup, "measured_tau": m.tau,
                         "predicted_tau": cand.tau, "tokens_per_s": m.tokens_per_s,
                         "baseline_tokens_per_s": m.baseline_tokens_per_s,
                         "measured_ms": {"draft": m.draft_ms, "verify": m.verify_ms,
                                         "loop_overhead": m.other_ms, "decode": m.decode_ms}})
        warning = gap_warning(cand, m)
        if warning:
            log.warning("warning: %s", warning)
            warnings.append(warning)
    best = results[0]
    measured = {"speedup": best.speedup, "tau": best.tau, "tokens_per_s": best.tokens_per_s,
                "baseline_tokens_per_s": best.baseline_tokens_per_s}
    return measured, verified, warnings


def _write_report(run_folder: Any, hardware_id: str) -> str | None:
    """The HTML report of the run (the search's files are written first and stay valid)."""
    from dreams_nas.reports import write_report

    try:
        return str(write_report(run_folder.root, hardware_id=hardware_id))
    except Exception as exc:  # noqa: BLE001 - a report failure must not lose the search
        log.warning("warning: the search is saved but report.html was not written (%s: %s); "
                    "run `dreams-nas report` to retry", type(exc).__name__, exc)
        return None


def _redact(url: str | None) -> str | None:
    """A storage URL without its password (the summary is printed and logged)."""
    if url is None or "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url
