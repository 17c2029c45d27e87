"""`dreams-nas demo` as one library call: the whole pipeline on the built-in target (or a
real-shaped proxy with `--target proxy-llava`).

target -> train -> profile -> score -> search (+ end-to-end verification) -> report, each stage
the same library call as its own command. Every stage first looks for its finished artefact in
the run folder (or the built-in target cache) and says "reused" instead of redoing the work, so a
second run only reads files. A stage that is not reused says in the log which of its inputs
changed ("search: redone (max_new_tokens 8 -> 32)").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dreams_nas.nas.stages.train import TrainOptions
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.runfolder import RunFolder

log = logging.getLogger("dreams_nas")
STAGES = ("target", "train", "profile", "score", "search", "report")
PROFILE_BUDGET = "--profile-budget"  # the demo's name of the profile's --budget
# the real pipeline's sizes that have no default elsewhere (a variant's `DemoSizes` may shrink)
PROFILE_REPEATS = 40
MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class DemoOptions:
    """The demo's settings; the defaults are the real pipeline (tests shrink them). The sizes
    left None (training prompts and steps, profile budget and repeats, limit, max_new_tokens,
    verify_prompts) are the built-in target variant's demo sizes (`BuiltinVariant.demo`: the
    real pipeline's for `default`, seconds for `tiny`), see `sized`."""

    device: str = "auto"
    dtype: str | None = None  # None/auto: the run's dtype, else auto (RunFolder.dtype)
    compile: str = "auto"  # --compile: the steps profiled, searched and verified compiled
    seed: int = 0
    target: str = "builtin"  # builtin (the built-in target) or a proxy name (proxy-llava)
    train: TrainOptions = field(default_factory=TrainOptions)
    profile_budget: float | int | str | None = None  # None: the whole grid
    # the demo's profile: 40 timed repeats per step in 4 interleaved passes (`dreams-nas
    # profile` defaults to 100 in 10); the demo's 20-minute bar pays for every pass's set-up.
    # None: the variant's demo size, else PROFILE_REPEATS
    profile_repeats: int | None = None
    profile_warmup: int = 3
    profile_passes: int = 4
    context_lengths: tuple[int, ...] | None = None
    threads: int | None = None  # CPU threads while profiling (default: physical cores)
    limit: int | None = None  # evaluation prompts (default 32)
    max_new_tokens: int | None = None  # None: the variant's, else MAX_NEW_TOKENS (train's too)
    verify: int = 3
    verify_prompts: int | None = None  # None: every scored evaluation prompt
    # passes over them (the median speedup); one keeps the demo's time (`search`: 3)
    verify_repeats: int = 1
    report: bool = True  # --no-report: the report stage is skipped (`dreams-nas report` later)
    show_progress: bool | None = None


@dataclass(frozen=True)
class StageOutcome:
    name: str
    reused: bool
    seconds: float
    summary: dict[str, Any]


class _Stages:
    """Runs the stages in order under one stage bar; each stage's own bars sit below it."""

    def __init__(self, show_progress: bool | None) -> None:
        from dreams_nas.supernet.core.progress import progress

        self.bar = progress(total=len(STAGES), desc="demo", unit="stage",
                            disable=None if show_progress is None else not show_progress)
        self.outcomes: list[StageOutcome] = []
        self.skipped: list[str] = []

    def run(self, name: str, step: Callable[[], tuple[dict[str, Any], bool]]) -> dict[str, Any]:
        index = STAGES.index(name) + 1
        self.bar.set_description_str(f"stage {index}/{len(STAGES)}: {name}")
        log.info("stage %d/%d: %s", index, len(STAGES), name)
        start = time.perf_counter()
        summary, reused = step()
        seconds = round(time.perf_counter() - start, 1)
        self.outcomes.append(StageOutcome(name, reused, seconds, summary))
        log.info("stage %d/%d: %s %s (%.1f s)", index, len(STAGES), name,
                 "reused" if reused else "done", seconds)
        self.bar.update(1)
        return summary

    def skip(self, name: str) -> dict[str, Any]:
        """A stage the options leave out: neither done nor reused."""
        log.info("stage %d/%d: %s skipped", STAGES.index(name) + 1, len(STAGES), name)
        self.skipped.append(name)
        self.bar.update(1)
        return {}

    def close(self) -> None:
        self.bar.close()


def run_demo(run_dir: str | Path, options: DemoOptions) -> dict[str, Any]:
    """The whole pipeline on the built-in target into `run_dir`; returns the summary."""
    from dreams_nas.latency.measure.plan import parse_budget
    from dreams_nas.nas.stages.inputs import check_run_folder
    from dreams_nas.supernet.core.device import resolve_device
    from dreams_nas.supernet.core.targets import BUILTIN, PROXY_TARGETS

    started = time.perf_counter()
    run = check_run_folder(RunFolder(run_dir))
    parse_budget(options.profile_budget, PROFILE_BUDGET)  # before the slow stages
    if options.target != BUILTIN and options.target not in PROXY_TARGETS:
        raise InputError(f"demo --target {options.target!r} is not a named target; pass "
                         f"one of {', '.join((BUILTIN, *PROXY_TARGETS))} (other targets: "
                         "`dreams-nas train`, `profile`, `score` and `search` one by one)")
    device = resolve_device(options.device)
    variant = _variant(options.target)
    # one dtype for every stage, resolved once (the run's when it has one)
    options = replace(sized(options), dtype=run.dtype(options.dtype, device))
    show = options.show_progress
    stages = _Stages(show)
    try:
        target: dict[str, Any] = {}

        def target_stage() -> tuple[dict[str, Any], bool]:
            folder, metrics, cached = _ensure_target(options.target, variant, show)
            target.update(folder=str(folder), exact_match=metrics.get("exact_match"))
            return {"folder": str(folder), "variant": variant,
                    "exact_match": metrics.get("exact_match")}, cached

        stages.run("target", target_stage)
        stages.run("train", lambda: _train(run, options, device, target["folder"]))
        profiled = stages.run("profile", lambda: _profile(run, options, device))
        hardware_id = profiled["hardware_id"]
        stages.run("score", lambda: _score(run, options, device))
        searched = stages.run("search", lambda: _search(run, options, device, hardware_id))
        report = (stages.run("report", lambda: _report(run, hardware_id)) if options.report
                  else stages.skip("report"))
    finally:
        stages.close()
    summary = _summary(run, variant, device, hardware_id, searched, report, stages.outcomes,
                       time.perf_counter() - started)
    summary["stages"].update(dict.fromkeys(stages.skipped, "skipped"))
    return summary


def sized(options: DemoOptions) -> DemoOptions:
    """`options` with every size left None set: the built-in target variant's demo sizes
    (`BuiltinVariant.demo`; a proxy target has none), then the real pipeline's. The training
    stage decodes as many new tokens as scoring and verification."""
    from dreams_nas.supernet.builtin.variants import DemoSizes, get_variant
    from dreams_nas.supernet.core.targets import BUILTIN

    sizes = get_variant(_variant(options.target)).demo if options.target == BUILTIN \
        else DemoSizes()

    def pick(given: Any, size: Any, default: Any = None) -> Any:
        return given if given is not None else size if size is not None else default

    train = options.train
    max_new_tokens = pick(options.max_new_tokens, sizes.max_new_tokens, MAX_NEW_TOKENS)
    train = replace(
        train, n_train=pick(train.n_train, sizes.train_prompts),
        warmup_steps=pick(train.warmup_steps, sizes.train_steps),
        multires_steps=pick(train.multires_steps, sizes.train_steps),
        max_new_tokens=max_new_tokens)
    return replace(
        options, train=train, max_new_tokens=max_new_tokens,
        profile_budget=pick(options.profile_budget, sizes.profile_budget),
        profile_repeats=pick(options.profile_repeats, sizes.profile_repeats, PROFILE_REPEATS),
        limit=pick(options.limit, sizes.limit),
        verify_prompts=pick(options.verify_prompts, sizes.verify_prompts))


def _variant(target: str) -> str:
    """The built-in target's variant for `builtin` (`DREAMS_NAS_DEMO_VARIANT`), else the proxy's
    name."""
    from dreams_nas.supernet.builtin.variants import builtin_variant
    from dreams_nas.supernet.core.targets import BUILTIN

    return builtin_variant() if target == BUILTIN else target


def _ensure_target(target: str, variant: str, show: bool | None
                   ) -> tuple[Any, dict[str, Any], bool]:
    """(folder, metrics, cached) of the built-in target the demo runs on."""
    from dreams_nas.supernet.builtin.cache import (
        ensure_builtin_target_with_metrics,
        ensure_proxy_target,
    )
    from dreams_nas.supernet.core.targets import BUILTIN

    if target == BUILTIN:
        return ensure_builtin_target_with_metrics(variant=variant, progress=show is not False)
    return ensure_proxy_target(target)


# --- the stages -------------------------------------------------------------------------------
def _train(run: RunFolder, options: DemoOptions, device: str, target_folder: str
           ) -> tuple[dict[str, Any], bool]:
    from dreams_nas.nas.stages.train import ensure_supernet

    train = replace(options.train, target=options.target, device=device, dtype=options.dtype,
                    seed=options.seed, show_progress=options.show_progress)
    return ensure_supernet(run, train, target_path=target_folder)


def _profile_options(options: DemoOptions, device: str) -> Any:
    from dreams_nas.nas.stages.profile import ProfileOptions

    return ProfileOptions(
        target=options.target, device=device, dtype=options.dtype,
        budget=options.profile_budget,
        context_lengths=options.context_lengths, limit=options.limit,
        max_new_tokens=options.max_new_tokens, repeats=options.profile_repeats,
        warmup=options.profile_warmup,
        passes=options.profile_passes,
        threads=options.threads, seed=options.seed, show_progress=options.show_progress,
        budget_option=PROFILE_BUDGET, compile=options.compile)


def _profile(run: RunFolder, options: DemoOptions, device: str) -> tuple[dict[str, Any], bool]:
    from dreams_nas.nas.stages.profile import profile
    from dreams_nas.nas.stages.profile_reuse import completed_profile

    profile_options = _profile_options(options, device)
    done = completed_profile(run, profile_options)
    if done is not None:
        return done, True
    return profile(run, profile_options), False


def _score(run: RunFolder, options: DemoOptions, device: str) -> tuple[dict[str, Any], bool]:
    from dreams_nas.nas.stages.score import ScoreOptions, score_run

    summary = score_run(run, ScoreOptions(
        limit=options.limit, max_new_tokens=options.max_new_tokens, device=device,
        dtype=options.dtype, seed=options.seed, show_progress=options.show_progress))
    if summary["n_scored"]:
        log.info("score: redone (%d of %d subnets had no row for dataset %s, max_new_tokens %d, "
                 "dtype %s, supernet %s)", summary["n_scored"], summary["n_specs"],
                 summary["dataset_id"], options.max_new_tokens, summary["dtype"],
                 summary["supernet_hash"])
    return summary, summary["n_scored"] == 0


def _search(run: RunFolder, options: DemoOptions, device: str, hardware_id: str
            ) -> tuple[dict[str, Any], bool]:
    from dreams_nas.nas.stages.search import SearchOptions, search_run

    search_options = SearchOptions(
        objective="speedup", method="exhaustive", hardware=hardware_id, limit=options.limit,
        max_new_tokens=options.max_new_tokens, verify=options.verify,
        verify_prompts=options.verify_prompts, verify_repeats=options.verify_repeats,
        device=device, dtype=options.dtype, seed=options.seed,
        show_progress=options.show_progress, write_report=False)
    done = finished_search(run, hardware_id, search_options)
    if done is not None:
        return done, True
    return search_run(run, search_options), False


def finished_search(run: RunFolder, hardware_id: str, options: Any) -> dict[str, Any] | None:
    """best.json's figures when it was computed from exactly what `options` ask for (every
    input `search_inputs` records, the supernet, objective and method) and is newer than the
    files it was computed from; else None, and the log says why ("search: redone (...)")."""
    from dreams_nas.supernet.core.io import read_json

    best_path = run.best_json(hardware_id)
    if not best_path.is_file():
        log.info("search: nothing to reuse (no %s)", best_path)
        return None
    best = read_json(best_path)
    changes = (search_changes(run, hardware_id, options, best) if isinstance(best, dict)
               else [f"{best_path} is not a JSON object"])
    if changes:
        log.info("search: redone (%s)", "; ".join(changes))
        return None
    predicted = best.get("predicted") or {}
    return {"hardware_id": hardware_id, "objective": best["objective"],
            "method": best["method"], "best": best.get("spec_id"),
            "spec_dir": str(run.root / best["spec_dir"]),
            "predicted": {k: predicted.get(k) for k in ("speedup", "tau", "draft_ms",
                                                         "first_draft_ms", "verify_ms",
                                                         "decode_ms")},
            "measured": best.get("measured"), "best_json": str(best_path), "warnings": []}


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(value.items())) + "}"
    return str(value)


def search_changes(run: RunFolder, hardware_id: str, options: Any, best: dict[str, Any]
                   ) -> list[str]:
    """Why `best` (search/<hw>/best.json) is not the answer to `options`, each as "name
    recorded -> asked" or in words; empty when it can be reused."""
    from dreams_nas.nas.stages.inputs import dataset_id, supernet_hash
    from dreams_nas.nas.stages.profile_reuse import predictor_changes
    from dreams_nas.nas.stages.search import predictor_meta, search_inputs

    sources = [run.supernet_dir / "model.safetensors", run.predictor_json(hardware_id),
               run.acceptance_csv(dataset_id(options.data, options.limit, options.seed))]
    absent = [p for p in sources if not p.is_file()]
    if absent:
        return [f"no {absent[0]}"]
    asked = {"objective": options.objective, "method": options.method,
             "supernet_hash": supernet_hash(run)}
    changes = [f"{key} {_show(best.get(key))} -> {_show(value)}"
               for key, value in asked.items() if best.get(key) != value]
    recorded = best.get("inputs")
    if not isinstance(recorded, dict):
        changes.append("best.json records no inputs (written by an older dreams-nas)")
    else:
        inputs = search_inputs(run, options, hardware_id, options.dtype)
        changes += [f"{key} {_show(recorded.get(key))} -> {_show(value)}"
                    for key, value in inputs.items() if recorded.get(key) != value]
    changes += predictor_changes(predictor_meta(run, hardware_id))  # refused when loaded
    if options.verify > 0 and not best.get("measured"):
        changes.append("best.json holds no end-to-end measurement")
    if not (run.root / str(best.get("spec_dir", ""))).is_dir():
        changes.append(f"no {run.root / str(best.get('spec_dir', ''))} folder")
    written = run.best_json(hardware_id).stat().st_mtime
    changes += [f"{p} changed after best.json" for p in sources if p.stat().st_mtime > written]
    return changes


def _report(run: RunFolder, hardware_id: str) -> tuple[dict[str, Any], bool]:
    from dreams_nas.nas.stages.search import write_run_report

    page = run.report_html
    sources = [run.best_json(hardware_id), run.trials_csv(hardware_id)]
    if page.is_file() and all(p.is_file() and p.stat().st_mtime <= page.stat().st_mtime
                              for p in sources):
        return {"report": str(page)}, True
    written = write_run_report(run, hardware_id)
    if written is None:
        raise InputError(f"report.html could not be written in {run.root}; see the warning "
                         "above and rerun `dreams-nas report`")
    return {"report": written}, False


def _summary(run: RunFolder, variant: str, device: str, hardware_id: str,
             searched: dict[str, Any], report: dict[str, Any], outcomes: list[StageOutcome],
             seconds: float) -> dict[str, Any]:
    predicted = searched.get("predicted") or {}
    measured = searched.get("measured") or {}

    def r(value: Any) -> Any:
        return round(float(value), 4) if isinstance(value, int | float) else value

    return {
        "best": searched.get("best"), "spec_dir": searched.get("spec_dir"),
        "predicted_speedup": r(predicted.get("speedup")),
        "measured_speedup": r(measured.get("speedup")),
        "measured_speedup_end_to_end": r(measured.get("speedup_end_to_end")),
        "predicted_tau": r(predicted.get("tau")), "measured_tau": r(measured.get("tau")),
        "report": report.get("report"), "best_json": searched.get("best_json"),
        "run": str(run.root), "hardware_id": hardware_id, "device": device,
        "dtype": run.read_run().get("dtype"),
        "target_variant": variant,
        "stages": {o.name: "reused" if o.reused else "done" for o in outcomes},
        "stage_seconds": {o.name: o.seconds for o in outcomes},
        "warnings": searched.get("warnings") or [],
        "seconds": round(seconds, 1),
    }
