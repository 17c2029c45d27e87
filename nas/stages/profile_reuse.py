"""Whether a finished profile can be reused (`completed_profile`): every planned step timed with
the settings asked for, the predictor fitted after the last row. Loads no model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from dreams_nas.latency.kinds import KINDS
from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.nas.stages.profile import ProfileOptions, timing_passes
from dreams_nas.supernet.core.device import resolve_compile, resolve_device
from dreams_nas.supernet.core.io import read_json
from dreams_nas.supernet.core.runfolder import RunFolder

log = logging.getLogger("dreams_nas.latency")


def completed_profile(run: RunFolder, options: ProfileOptions) -> dict[str, Any] | None:
    """The summary of this device's finished profile (every planned step timed with the same
    settings, predictor fitted after the last row), or None when `profile` has work to do --
    then the log says why ("profile: redone (repeats 3 -> 5)").

    Loads no model: the demo and `search` use it to skip a profile that is already done."""
    device = resolve_device(options.device)
    dtype_name = run.dtype(options.dtype, device)
    hw = detect_hardware(device, dtype=dtype_name, threads=options.threads,
                         steps=resolve_compile(options.compile, device), batch=options.batch)
    store = ProfileStore(run.profile_csv(hw.hardware_id))
    plan_path = run.plan_json(hw.hardware_id)
    predictor_path = run.predictor_json(hw.hardware_id)
    missing = [p for p in (store.path, plan_path, predictor_path)
               if not (p.is_file() and p.stat().st_size > 0)]
    if missing:
        log.info("profile: nothing to reuse (no %s)", missing[0])
        return None
    changes = profile_changes(run, options, store, read_json(plan_path), predictor_path)
    if changes:
        log.info("profile: redone (%s)", "; ".join(changes))
        return None
    report = read_json(predictor_path)
    return {"hardware_id": hw.hardware_id, "device": device, "profile": str(store.path),
            "rows": int(len(store.read())), "predictor": str(predictor_path),
            "regressor": report.get("regressor") if isinstance(report, dict) else None}


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return "[" + " ".join(map(str, value)) + "]"
    return str(value)


def profile_changes(run: RunFolder, options: ProfileOptions, store: ProfileStore,
                    plan: Any, predictor_path: Path) -> list[str]:
    """Why the profile in `store` is not the finished one `options` ask for, each as
    "name recorded -> asked" or in words; empty when it can be reused."""
    plan = plan if isinstance(plan, dict) else {}
    asked: dict[str, Any] = {
        "budget": options.budget, "repeats": options.repeats, "clock": options.clock,
        "passes": timing_passes(options.repeats, options.passes), "seed": options.seed}
    if options.context_lengths is not None:
        asked["context_lengths"] = list(options.context_lengths)
    asked["warmup"] = options.warmup
    changes = [f"{key} {_show(plan.get(key))} -> {_show(value)}"
               for key, value in asked.items() if plan.get(key) != value]
    if plan.get("transfer") and not options.transfer_from:
        changes.append("its prices were transferred from another device; a profile of its own "
                       "times the rest of the grid")
    if run.read_run().get("space") not in (None, plan.get("space")):
        changes.append("the run's search space changed since the plan")  # new steps to time
    report = read_json(predictor_path)
    report = report if isinstance(report, dict) else {}
    if report.get("stat") != options.stat:
        changes.append(f"stat {_show(report.get('stat'))} -> {options.stat}")
    changes += predictor_changes(report)
    if changes:
        return changes
    rows = store.read()
    planned, done = int(plan.get("n_keys", 0)), len(store.done_keys())
    if done < planned:
        changes.append(f"{planned - done} of {planned} planned steps not timed yet")
    trees = bool((plan.get("space") or {}).get("trees"))  # *_tree kinds: for trees only
    absent = [kind for kind in KINDS
              if kind not in set(rows["kind"]) and (trees or not kind.endswith("_tree"))]
    if absent:
        changes.append(f"no {', '.join(absent)} step timed yet")
    if predictor_path.stat().st_mtime < store.path.stat().st_mtime:
        changes.append("profile.csv has rows newer than the fitted predictor")
    return changes


def predictor_changes(report: dict[str, Any]) -> list[str]:
    """Why predictor.json cannot be loaded by this dreams-nas (another schema or scikit-learn
    version, which `LatencyPredictor.load` refuses): the profile is then fitted again from its
    rows, nothing timed anew."""
    from dreams_nas.latency.model.persist import PREDICTOR_SCHEMA_VERSION
    from dreams_nas.supernet.core.versions import library_versions

    changes = []
    if report.get("schema_version") != PREDICTOR_SCHEMA_VERSION:
        changes.append(f"predictor schema {_show(report.get('schema_version'))} -> "
                       f"{PREDICTOR_SCHEMA_VERSION}")
    fitted = (report.get("versions") or {}).get("scikit-learn")
    installed = library_versions().get("scikit-learn")
    if fitted != installed:
        changes.append(f"predictor fitted with scikit-learn {_show(fitted)} -> {installed}")
    return changes
