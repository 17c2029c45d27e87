"""`dreams-nas search` as one library call: train the supernet if missing, score what the
acceptance CSV lacks, search, export the deployable specs, verify the best end to end, report."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
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


def transfer_note(predictor: dict[str, Any]) -> str:
    """How the prices were obtained, best.json's `inputs.latency`: ``profiled`` (this device's
    own full profile) or ``transferred from <ids> (<N> steps measured here)``. Not among
    `search_inputs`: it follows from predictor.json, which `predictor_created` already keys."""
    transfer = predictor.get("transfer")
    if not isinstance(transfer, dict):
        return "profiled"
    ids = ", ".join(str(s.get("hardware_id")) for s in transfer.get("sources") or ()
                    if isinstance(s, dict))
    return f"transferred from {ids} ({transfer.get('measured')} steps measured here)"


def search_run(run: RunFolder, options: SearchOptions) -> dict[str, Any]:
    """`dreams-nas search`: score what the acceptance CSV lacks, search, export the specs,
    verify the pick end to end, write the report; returns the summary."""
    from dreams_nas.nas.stages.inputs import check_run_folder, dataset_id, resolve_hardware
    from dreams_nas.supernet.core.device import resolve_device
    from dreams_nas.supernet.core.runlock import stage_lock

    check_run_folder(run)
    _check_options(options)
    resolve_device(options.device)  # a device not here: before anything else is read
    locks = [f"search-{resolve_hardware(run, options.hardware)}",
             f"acceptance-{dataset_id(options.data, options.limit, options.seed)}"]
    with stage_lock(run.root, locks, "dreams-nas search"):
        return _search_locked(run, options)


def _search_locked(run: RunFolder, options: SearchOptions) -> dict[str, Any]:
    """`search_run` while it holds the run folder's search and acceptance locks."""
    from dreams_nas.nas.stages.export import SearchRecord, export_result, write_best
    from dreams_nas.nas.stages.verify_pick import verify_best

    setup = _setup(run, options)
    result, inputs, context_len, notes = _searched(run, options, setup)
    if result.best is None:
        raise InputError(f"no subnet meets --max-draft-ms {options.max_draft_ms}; the fastest "
                         f"draft step is {min(c.draft_ms for c in result.candidates):.3f} ms: "
                         "raise it")
    hardware = setup.hardware
    info = run.read_run().get("target") or {}

    def write_draft(spec: Any, folder: Any) -> None:
        from dreams_nas.supernet.draft.extract import extract

        extract(setup.models.draft, spec).save_pretrained(folder)

    # Everything the search found is on disk before the (long, fallible) measurement.
    record = SearchRecord(setup.hardware_id, hardware, setup.digest, setup.dtype, target=info,
                          inputs=inputs, cycle_note=notes["unpriced"])
    paths = export_result(run, result, record, write_draft=write_draft)
    measured, verified, warnings = verify_best(
        options, result, setup.models, setup.scorer, hardware,
        retime=(run, context_len, setup.space))
    if measured is not None:
        write_best(run, result, record, measured, verified)
    report = write_run_report(run, setup.hardware_id) if options.write_report else None
    return _summary(result, setup, paths, measured, notes, warnings, report)


@dataclass
class _Setup:
    """What a search reads before it searches (`_setup`)."""

    hardware_id: str
    dtype: str
    digest: str
    space: Any
    data_id: str
    models: Any
    scorer: Any
    cached: Any
    storage: str | None
    hardware: dict[str, Any]  # hardware.json: what the latencies were measured on


def _check_options(options: SearchOptions) -> None:
    import optuna

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


def _setup(run: RunFolder, options: SearchOptions) -> _Setup:
    """The run's hardware id, dtype, trained supernet (trained first when missing), space,
    acceptance table and lazy scorer, and the study's storage."""
    from dreams_nas.nas.search.scoring import CachedAcceptance
    from dreams_nas.nas.stages.inputs import (
        LazyScorer,
        RunModels,
        dataset_id,
        hardware_identity,
        resolve_hardware,
        supernet_hash,
    )
    from dreams_nas.nas.stages.train import ensure_supernet, trained_supernet
    from dreams_nas.supernet.acceptance.table import AcceptanceTable
    from dreams_nas.supernet.core.device import resolve_device

    device = resolve_device(options.device)
    dtype = run.dtype(options.dtype, device)
    hardware_id = resolve_hardware(run, options.hardware)
    hardware = hardware_identity(run, hardware_id)  # what a measurement must reproduce
    if trained_supernet(run) is None:  # no weights at all; unrecorded weights are refused
        ensure_supernet(run, replace(options.train, target=run.target_source() or "builtin",
                                     device=device, dtype=dtype, seed=options.seed,
                                     show_progress=options.show_progress))
    run.record_dtype(dtype)
    digest, space = supernet_hash(run), chains_at_batch(run.space(), hardware)
    data_id = dataset_id(options.data, options.limit, options.seed)
    table = AcceptanceTable(run.acceptance_csv(data_id), digest, data_id, 0.0, dtype=dtype,
                            max_new_tokens=options.max_new_tokens)
    models = RunModels(run, device, dtype)
    scorer = LazyScorer(models, data=options.data, limit=options.limit, seed=options.seed,
                        supernet_hash=digest, dataset_id=data_id,
                        max_new_tokens=options.max_new_tokens, draft_lens=space.draft_len,
                        trees=space.trees, show_progress=options.show_progress)
    storage = options.storage
    if storage is None and options.method == "optuna":
        db = run.study_db(hardware_id)
        db.parent.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{db.resolve()}"
    return _Setup(hardware_id, dtype, digest, space, data_id, models, scorer,
                  CachedAcceptance(scorer, table), storage, hardware)


def chains_at_batch(space: Any, hardware: dict[str, Any]) -> Any:
    """The space a search prices on `hardware` (hardware.json): the run's, without its token
    trees when the profile is of a batch of B > 1 requests (batched decoding drafts chains;
    its profile times no tree)."""
    batch = int(hardware.get("batch") or 1)
    if batch == 1 or not space.trees:
        return space
    log.info("batch %d: the space's %d token tree(s) are left out (batched decoding drafts "
             "chains)", batch, len(space.trees))
    return replace(space, trees=())


def _searched(run: RunFolder, options: SearchOptions, setup: _Setup
              ) -> tuple[Any, dict[str, Any], int, dict[str, str | None]]:
    """(the search's result, best.json's `inputs`, the context it priced at, the notes on the
    predictor): the latency predictor is loaded and checked, then the space searched."""
    from dreams_nas.nas.search.candidate import DraftCost, Pricing
    from dreams_nas.nas.search.config import SearchConfig
    from dreams_nas.nas.search.strategies import search
    from dreams_nas.nas.stages.inputs import (
        context_len_of,
        draft_memory_fn,
        draft_params_fn,
        load_latency,
    )
    from dreams_nas.supernet.core.device import torch_threads

    hardware_id, table = setup.hardware_id, setup.cached.table
    with torch_threads(options.threads):
        latency = load_latency(run, hardware_id, setup.dtype)
        inputs = {**search_inputs(run, options, hardware_id, setup.dtype),  # the predictor it reads
                  "latency": transfer_note(predictor_meta(run, hardware_id))}
        context_len = context_len_of(table, setup.scorer)
        # the step costs are predicted at this context: refused outside the profiled contexts
        # (up to a tenth of their span), before anything is scored or searched
        latency.check_context(context_len, "the eval prompts' median length plus half the answer")
        key = study_key(run, options, hardware_id=hardware_id, data_id=setup.data_id,
                        digest=setup.digest, dtype=setup.dtype, context_len=context_len,
                        temperature=table.temperature)
        notes = {"unpriced": cycle_overhead_note(latency, setup.space, hardware_id),
                 "stale": stale_profile_note(latency, run, hardware_id)}
        for note in notes.values():
            if note:
                log.warning("warning: %s", note)
        memory = draft_memory_fn(run, context_len, latency.visual_tokens, setup.dtype)
        pricing = Pricing(latency, context_len, DraftCost(draft_params_fn(run), memory))
        config = SearchConfig(
            objective=options.objective, method=options.method, front=options.front,
            max_draft_ms=options.max_draft_ms, n_trials=options.trials, storage=setup.storage,
            study_name=options.study_name or study_name_for(options, hardware_id, setup.data_id,
                                                            setup.digest, key),
            seed=options.seed, show_progress=options.show_progress)
        result = search(setup.space, setup.cached, pricing, config, study_key=key)
    return result, inputs, context_len, notes


def _summary(result: Any, setup: _Setup, paths: dict[str, Any], measured: dict[str, Any] | None,
             notes: dict[str, str | None], warnings: list[str], report: str | None
             ) -> dict[str, Any]:
    best = result.best
    summary: dict[str, Any] = {
        "hardware_id": setup.hardware_id, "objective": result.objective,
        "method": result.method, "front_axes": result.front_axes, "dtype": setup.dtype,
        "best": best.spec.id, "spec_dir": str(paths["spec_dir"]),
        "predicted": {"speedup": round(best.speedup, 4), "tau": round(best.tau, 4),
                      "draft_ms": round(best.draft_ms, 4),
                      "first_draft_ms": round(best.first_draft_ms, 4),
                      "verify_ms": round(best.verify_ms, 4),
                      "decode_ms": round(best.decode_ms, 4),
                      "cycle_overhead_ms": round(best.cycle_overhead_ms, 4)},
        "cycle_overhead_priced": notes["unpriced"] is None,
        "measured": measured, "n_evaluations": result.n_evaluations,
        "space_size": result.space_size, "n_scored": result.n_scored,
        "front": [c.spec.id for c in result.front], "best_json": str(paths["best"]),
        "warnings": [note for note in notes.values() if note] + warnings,
    }
    if measured is not None:
        summary["gap_pct"] = round(measured["gap_pct"], 2)
    if result.study_name:
        summary["study_name"] = result.study_name
        summary["storage"] = redact(setup.storage)
    if report:
        summary["report"] = report
    return summary


def cycle_overhead_note(latency: Any, space: Any, hardware_id: str) -> str | None:
    """None when the predictor prices the speculative cycle's own work for every shape the
    space drafts (chains, and trees when it has them); else the one line that says the
    search prices it 0 ms (a profile without the ``cycle`` kinds) and how to fix it."""
    missing = [kind for kind, tree in (("cycle", False), ("cycle_tree", True))
               if (tree and space.trees or not tree) and not latency.prices(kind)]
    if not missing:
        return None
    return (f"the latency profile of {hardware_id} has no {'/'.join(missing)} rows (the "
            "speculative cycle's own work was not timed): its expected speedups price "
            "that work as 0 ms and run high; rerun `dreams-nas profile` (it times only the "
            "missing rows) to price it")


def stale_profile_note(latency: Any, run: RunFolder, hardware_id: str) -> str | None:
    """None when the predictor's rows were timed by this program's way of running the steps
    (`latency.measure.steps.STEP_REVISION`); else the one line that says its prices are another
    program's and how to profile again."""
    from dreams_nas.latency.measure.steps import STEP_REVISION

    fingerprint = getattr(latency, "fingerprint", None)
    if not isinstance(fingerprint, dict) or not fingerprint:
        return None  # a model fitted without a profile's fingerprint (tests, replays)
    have = fingerprint.get("step_revision")
    if have == STEP_REVISION:
        return None
    return (f"the latency profile of {hardware_id} was timed by another dreams-nas (step "
            f"revision {have}; this one runs revision {STEP_REVISION}, whose steps cost "
            "differently): its prices, and the speedups predicted with them, are stale; move "
            f"{run.latency_dir(hardware_id)} aside and rerun `dreams-nas profile`")


def write_run_report(run: RunFolder, hardware_id: str) -> str | None:
    """The HTML report of the run (the search's files are written first and stay valid)."""
    from dreams_nas.reports import write_report

    try:
        return str(write_report(run.root, hardware_id=hardware_id))
    except Exception as exc:  # noqa: BLE001 - a report failure must not lose the search
        log.warning("warning: the search is saved but report.html was not written (%s: %s); "
                    "run `dreams-nas report` to retry", type(exc).__name__, exc)
        return None

