"""`dreams-nas search` as one library call: train the supernet if missing, score what the
acceptance CSV lacks, search, export the deployable specs, verify the best end to end, report."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from dreams_nas.nas.search.storage import check_storage, redact
from dreams_nas.nas.stages.train import TrainOptions
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder

log = logging.getLogger("dreams_nas")


@dataclass(frozen=True)
class SearchOptions:
    objective: str = "speedup"
    front: str = "tau-latency"  # the pair of the Pareto front (strategies.FRONTS)
    method: str = "exhaustive"
    trials: int | None = None
    storage: str | None = None
    study_name: str | None = None
    hardware: str | None = None
    max_draft_ms: float | None = None
    data: str = "builtin"
    limit: int | None = None
    max_new_tokens: int = 64
    verify: int = 3
    verify_prompts: int | None = None  # None: every scored prompt (measured tau = scored tau)
    verify_repeats: int = 3  # passes over the prompts; the measured speedup is their median
    # time the best subnet's steps again among the prompts (`retime`): the formula's gap with
    # the machine as it is now, and each step's drift since the profile
    retime: bool = True
    device: str = "auto"
    dtype: str | None = None  # None/auto: the run's dtype (RunFolder.dtype)
    threads: int | None = None
    seed: int = 0
    show_progress: bool | None = None
    write_report: bool = True
    # used only when the run folder holds no trained supernet yet
    train: TrainOptions = field(default_factory=TrainOptions)


def study_name_for(options: SearchOptions, hardware_id: str, data_id: str, digest: str,
                   key: dict[str, Any] | None = None) -> str:
    """The default study name: the objective, constraint, hardware, data and supernet, then a
    digest of `key` (`study_key`), so a study is continued only with the inputs it was
    computed from."""
    from dreams_nas.nas.search.strategies import default_study_name

    base = default_study_name(options.objective, options.max_draft_ms, options.method,
                              options.front)
    name = f"{base}-{hardware_id}-{data_id}-{digest}"
    if key is None:
        return name
    from dreams_nas.nas.search.sampler import key_digest

    return f"{name}-{key_digest(key)}"


def predictor_meta(run: RunFolder, hardware_id: str) -> dict[str, Any]:
    """predictor.json of `hardware_id` ({} when absent or unreadable as an object)."""
    from dreams_nas.supernet.core.io import read_json

    path = run.predictor_json(hardware_id)
    meta = read_json(path) if path.is_file() else {}
    return meta if isinstance(meta, dict) else {}


def study_key(run: RunFolder, options: SearchOptions, *, hardware_id: str, data_id: str,
              digest: str, dtype: str, context_len: int, temperature: float) -> dict[str, Any]:
    """Everything a study's stored speedups depend on besides the space and the objective
    (which the study checks itself): a re-profiled or refitted predictor, another context,
    token budget, temperature or dtype makes another study."""
    import hashlib
    import json

    predictor = predictor_meta(run, hardware_id)
    # the whole predictor.json (its model file's hash, metrics...): a refit within the second
    # of `created` changes it too
    document = json.dumps(predictor, sort_keys=True, default=str).encode()
    return {
        "hardware_id": hardware_id, "dataset_id": data_id, "supernet_hash": digest,
        "predictor_fingerprint": predictor.get("fingerprint"),
        "predictor_created": predictor.get("created"),
        "predictor_stat": predictor.get("stat", "median_ms"),
        "predictor_sha256": hashlib.sha256(document).hexdigest()[:16],
        "context_len": int(context_len), "max_new_tokens": int(options.max_new_tokens),
        "temperature": float(temperature), "dtype": dtype,
    }


def search_inputs(run: RunFolder, options: SearchOptions, hardware_id: str, dtype: str
                  ) -> dict[str, Any]:
    """best.json's `inputs` block: everything the search's answer depends on besides the
    supernet (its hash is best.json's `supernet_hash`), objective and method -- the evaluation
    data and settings, the acceptance file and the latency predictor it read. A best.json is
    reused only when these equal what is asked (`nas.stages.demo.finished_search`)."""
    from dreams_nas.nas.stages.inputs import dataset_id

    data_id = dataset_id(options.data, options.limit, options.seed)
    predictor = predictor_meta(run, hardware_id)
    return {
        "dataset_id": data_id, "limit": options.limit, "max_new_tokens": options.max_new_tokens,
        "verify": options.verify, "verify_prompts": options.verify_prompts,
        "verify_repeats": options.verify_repeats,
        "seed": options.seed, "dtype": dtype, "max_draft_ms": options.max_draft_ms,
        "trials": options.trials, "front": options.front,
        "acceptance": run.acceptance_csv(data_id).relative_to(run.root).as_posix(),
        "predictor_fingerprint": predictor.get("fingerprint"),
        "predictor_created": predictor.get("created"),
    }


def search_run(run: RunFolder, options: SearchOptions) -> dict[str, Any]:
    import optuna
    from dreams_nas.nas.search.scoring import CachedAcceptance
    from dreams_nas.nas.search.strategies import search as _search
    from dreams_nas.nas.stages.export import export_result, write_best
    from dreams_nas.nas.stages.inputs import (
        LazyScorer,
        RunModels,
        check_run_folder,
        context_len_of,
        dataset_id,
        draft_memory_fn,
        draft_params_fn,
        hardware_identity,
        load_latency,
        resolve_hardware,
        supernet_hash,
    )
    from dreams_nas.nas.stages.train import ensure_supernet, trained_supernet
    from dreams_nas.supernet.acceptance.table import AcceptanceTable
    from dreams_nas.supernet.core.device import resolve_device, torch_threads

    check_run_folder(run)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar says it all
    if options.trials is not None and options.trials < 1:
        raise InputError(f"--trials {options.trials} must be at least 1")
    if options.verify < 0 or (options.verify_prompts is not None and options.verify_prompts < 1):
        raise InputError("--verify must be >= 0 and --verify-prompts >= 1")
    if options.verify_repeats < 1:
        raise InputError(f"--verify-repeats {options.verify_repeats} must be >= 1 (the passes "
                         "over the prompts whose median speedup is reported)")
    if options.storage is not None:
        check_storage(options.storage)  # unreachable: fail now, not after training and scoring
    device = resolve_device(options.device)
    dtype = run.dtype(options.dtype, device)
    hardware_id = resolve_hardware(run, options.hardware)
    if trained_supernet(run) is None:  # no weights at all; unrecorded weights are refused
        from dataclasses import replace

        ensure_supernet(run, replace(options.train, target=run.target_source() or "builtin",
                                     device=device, dtype=dtype, seed=options.seed,
                                     show_progress=options.show_progress))
    run.record_dtype(dtype)
    digest = supernet_hash(run)
    space = run.space()
    data_id = dataset_id(options.data, options.limit, options.seed)
    table = AcceptanceTable(run.acceptance_csv(data_id), digest, data_id, 0.0, dtype=dtype,
                            max_new_tokens=options.max_new_tokens)
    show = options.show_progress
    models = RunModels(run, device, dtype)
    scorer = LazyScorer(models, data=options.data, limit=options.limit, seed=options.seed,
                        supernet_hash=digest, dataset_id=data_id,
                        max_new_tokens=options.max_new_tokens, draft_lens=space.draft_len,
                        trees=space.trees, show_progress=show)
    cached = CachedAcceptance(scorer, table)
    storage = options.storage
    if storage is None and options.method == "optuna":
        db = run.study_db(hardware_id)
        db.parent.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{db.resolve()}"
    with torch_threads(options.threads):
        latency = load_latency(run, hardware_id, dtype)  # may refit: what follows reads it after
        inputs = search_inputs(run, options, hardware_id, dtype)  # the predictor it reads
        context_len = context_len_of(table, scorer)
        # the step costs are predicted at this context: refused outside the profiled contexts
        # (up to a tenth of their span), before anything is scored or searched
        latency.check_context(context_len, "the eval prompts' median length plus half the answer")
        key = study_key(run, options, hardware_id=hardware_id, data_id=data_id, digest=digest,
                        dtype=dtype, context_len=context_len, temperature=table.temperature)
        study_name = options.study_name or study_name_for(options, hardware_id, data_id,
                                                          digest, key)
        memory = draft_memory_fn(run, context_len, getattr(latency, "visual_tokens", 0), dtype)
        unpriced = cycle_overhead_note(latency, space, hardware_id)
        if unpriced:
            log.warning("warning: %s", unpriced)
        stale = stale_profile_note(latency, run, hardware_id)
        if stale:
            log.warning("warning: %s", stale)
        result = _search(
            space, cached, latency, draft_params_fn(run), draft_memory=memory,
            front=options.front, context_len=context_len, objective=options.objective,
            method=options.method, max_draft_ms=options.max_draft_ms, n_trials=options.trials,
            storage=storage, study_name=study_name, seed=options.seed, show_progress=show,
            study_key=key,
        )
    if result.best is None:
        raise InputError(f"no subnet meets --max-draft-ms {options.max_draft_ms}; the fastest "
                         f"draft step is {min(c.draft_ms for c in result.candidates):.3f} ms: "
                         "raise it")
    hardware = hardware_identity(run, hardware_id)
    info = run.read_run().get("target") or {}

    def write_draft(spec, folder):
        from dreams_nas.supernet.draft.extract import extract

        extract(models.draft, spec).save_pretrained(folder)

    # Everything the search found is on disk before the (long, fallible) measurement.
    paths = export_result(run, result, hardware_id=hardware_id, hardware=hardware,
                          target=info, supernet_hash=digest, dtype=dtype,
                          write_draft=write_draft, inputs=inputs, cycle_note=unpriced)
    measured, verified, warnings = verify_best(options, result, models, scorer, hardware,
                                               retime=(run, context_len, space))
    if measured is not None:
        write_best(run, result, hardware_id=hardware_id, hardware=hardware,
                   supernet_hash=digest, dtype=dtype, measured=measured, verified=verified,
                   inputs=inputs, cycle_note=unpriced)
    report = write_run_report(run, hardware_id) if options.write_report else None
    best = result.best
    summary: dict[str, Any] = {
        "hardware_id": hardware_id, "objective": result.objective, "method": result.method,
        "front_axes": result.front_axes, "dtype": dtype, "best": best.spec.id,
        "spec_dir": str(paths["spec_dir"]),
        "predicted": {"speedup": round(best.speedup, 4), "tau": round(best.tau, 4),
                      "draft_ms": round(best.draft_ms, 4),
                      "first_draft_ms": round(best.first_draft_ms, 4),
                      "verify_ms": round(best.verify_ms, 4),
                      "decode_ms": round(best.decode_ms, 4),
                      "cycle_overhead_ms": round(best.cycle_overhead_ms, 4)},
        "cycle_overhead_priced": unpriced is None,
        "measured": measured, "n_evaluations": result.n_evaluations,
        "space_size": result.space_size, "n_scored": result.n_scored,
        "front": [c.spec.id for c in result.front], "best_json": str(paths["best"]),
        "warnings": [note for note in (unpriced, stale) if note] + warnings,
    }
    if measured is not None:
        summary["gap_pct"] = round(measured["gap_pct"], 2)
    if result.study_name:
        summary["study_name"] = result.study_name
        summary["storage"] = redact(storage)
    if report:
        summary["report"] = report
    return summary


def cycle_overhead_note(latency: Any, space: Any, hardware_id: str) -> str | None:
    """None when the predictor prices the speculative cycle's own work for every shape the
    space drafts (chains, and trees when it has them); else the one line that says the
    search prices it 0 ms (a profile made before the ``cycle`` kinds) and how to fix it."""
    profiled = getattr(latency, "cycle_profiled", None)
    if profiled is None:
        return None  # a model that prices no overhead by design (tests, replays)
    missing = [kind for kind, tree in (("cycle", False), ("cycle_tree", True))
               if (tree and space.trees or not tree) and not profiled(tree)]
    if not missing:
        return None
    return (f"the latency profile of {hardware_id} has no {'/'.join(missing)} rows (profiled "
            "before the speculative cycle's own work was timed): its expected speedups price "
            "that work as 0 ms and run high; rerun `dreams-nas profile` (it times only the "
            "missing rows) to price it")


def stale_profile_note(latency: Any, run: RunFolder, hardware_id: str) -> str | None:
    """None when the predictor's rows were timed by this program's way of running the steps
    (`latency.steps.STEP_REVISION`, a profile before it recorded one: 1); else the one line
    that says its prices are another program's and how to profile again."""
    from dreams_nas.latency.steps import STEP_REVISION

    fingerprint = getattr(latency, "fingerprint", None)
    if not isinstance(fingerprint, dict) or not fingerprint:
        return None  # a model fitted without a profile's fingerprint (tests, replays)
    have = fingerprint.get("step_revision") or 1
    if have == STEP_REVISION:
        return None
    return (f"the latency profile of {hardware_id} was timed by another dreams-nas (step "
            f"revision {have}; this one runs revision {STEP_REVISION}, whose steps cost "
            "differently): its prices, and the speedups predicted with them, are stale; move "
            f"{run.latency_dir(hardware_id)} aside and rerun `dreams-nas profile`")


def verify_best(options: SearchOptions, result: Any, models: Any, scorer: Any,
                hardware: dict[str, Any], retime: tuple[RunFolder, int, Any] | None = None
                ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """Measure the best subnet and the top of the front end to end against plain decoding.
    `retime`: (the run, the search's context, the space) to time the best subnet's steps
    again among the prompts (`retime`: the formula with the machine as it is now)."""
    from dreams_nas.nas.stages.verify import gap_line, gap_warning, measure_end_to_end, speedup_gap
    from dreams_nas.supernet.core.device import torch_threads

    if options.verify == 0:
        return None, [], []
    here = models.device.split(":")[0]
    profiled = hardware.get("hardware_id")
    this = this_machine(models.device, hardware) if profiled else None
    if profiled and this != profiled:
        warning = (f"not verified: the latency profile is of {profiled} and this run decodes on "
                   f"{this} ({models.device}); run the search there to measure the speedup")
        log.warning("warning: %s", warning)
        return None, [], [warning]
    chosen = [result.best] + [c for c in result.front if c.spec != result.best.spec]
    chosen = chosen[: options.verify]
    prompts = scorer.prompts[: options.verify_prompts]
    log.info("verifying %d subnet(s) end to end on %d prompts against plain decoding, %d "
             "repeat(s)", len(chosen), len(prompts), options.verify_repeats)
    threads = hardware.get("threads") if here == "cpu" else None
    retimer = None
    if retime is not None and options.retime:
        from dreams_nas.nas.stages.retime import build_retimer

        run, context_len, space = retime
        retimer = build_retimer(run, models, result.best, context_len, hardware, space)
    with torch_threads(int(threads) if threads else None):  # the profile's setting
        results = measure_end_to_end(models.target, models.draft, [c.spec for c in chosen],
                                     prompts, max_new_tokens=options.max_new_tokens,
                                     repeats=options.verify_repeats,
                                     show_progress=options.show_progress, between=retimer)
    verified, warnings = [], []
    for cand, m in zip(chosen, results, strict=True):
        verified.append({"spec_id": cand.spec.id, "predicted_speedup": cand.speedup,
                         "measured_speedup": m.speedup,
                         "measured_speedup_range": list(m.speedup_range),
                         "repeat_speedups": list(m.repeat_speedups),
                         "gap_pct": speedup_gap(cand, m)["gap_pct"],
                         "measured_speedup_end_to_end": m.speedup_end_to_end,
                         "measured_tau": m.tau,
                         "predicted_tau": cand.tau, "tokens_per_s": m.tokens_per_s,
                         "baseline_tokens_per_s": m.baseline_tokens_per_s,
                         "decode_tokens_per_s": m.decode_tokens_per_s,
                         "baseline_decode_tokens_per_s": m.baseline_decode_tokens_per_s,
                         "measured_ms": {"draft": m.draft_ms, "verify": m.verify_ms,
                                         "loop_overhead": m.other_ms, "decode": m.decode_ms},
                         "identical_prompts": m.identical_prompts})
        warning = gap_warning(cand, m)
        if warning:
            log.warning("warning: %s", warning)
            warnings.append(warning)
    best = results[0]
    gap = speedup_gap(chosen[0], best)
    log.info("%s", gap_line(chosen[0], best))
    retimed = None
    if retimer is not None:
        from dreams_nas.nas.stages.retime import retime_lines

        retimed = retimer.summary(best.speedup)
        line, stale = retime_lines(retimed, chosen[0])
        log.info("%s", line)
        if stale:
            log.warning("warning: %s", stale)
            warnings.append(stale)
    measured = {"speedup": best.speedup, "speedup_range": list(best.speedup_range),
                "repeats": len(best.repeat_speedups),
                "repeat_speedups": list(best.repeat_speedups),
                "speedup_end_to_end": best.speedup_end_to_end,
                "predicted_speedup": gap["predicted_speedup"], "gap_pct": gap["gap_pct"],
                "tau": best.tau, "tokens_per_s": best.tokens_per_s,
                "baseline_tokens_per_s": best.baseline_tokens_per_s,
                "decode_tokens_per_s": best.decode_tokens_per_s,
                "baseline_decode_tokens_per_s": best.baseline_decode_tokens_per_s,
                "prompts": best.prompts, "identical_prompts": best.identical_prompts,
                "divergences": [asdict(d) for d in best.divergences],
                "dtype": str(models.target.dtype).removeprefix("torch."),
                "max_new_tokens": options.max_new_tokens}
    if retimed is not None:
        measured["retimed"] = retimed
    for cand, m in zip(chosen, results, strict=True):
        if m.divergences:
            warning = (f"{cand.spec.id}: {m.identical_prompts} of {m.prompts} prompts identical "
                       "to plain greedy decoding; the others diverge at near ties of the "
                       "target's logits (its 16-bit numerics), recorded in best.json")
            log.warning("warning: %s", warning)
            warnings.append(warning)
    return measured, verified, warnings


def this_machine(device: str, profiled: dict[str, Any]) -> str:
    """The hardware id of `device` here, identified as the profile was (its dtype, and on the
    CPU its thread count)."""
    from dreams_nas.latency.hardware import detect_hardware

    threads = profiled.get("threads") if device.startswith("cpu") else None
    return detect_hardware(device, dtype=str(profiled.get("dtype") or "float32"),
                           threads=int(threads) if threads else None).hardware_id


def write_run_report(run: RunFolder, hardware_id: str) -> str | None:
    """The HTML report of the run (the search's files are written first and stay valid)."""
    from dreams_nas.reports import write_report

    try:
        return str(write_report(run.root, hardware_id=hardware_id))
    except Exception as exc:  # noqa: BLE001 - a report failure must not lose the search
        log.warning("warning: the search is saved but report.html was not written (%s: %s); "
                    "run `dreams-nas report` to retry", type(exc).__name__, exc)
        return None

