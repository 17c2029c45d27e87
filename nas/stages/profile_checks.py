"""What a profile's rows answer for (`profile_fingerprint`) and what they may be appended with:
rows of another target architecture, dtype, clock or software stack are another machine's,
refused rather than merged."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dreams_nas.latency.measure.hardware import HardwareInfo
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import read_json

log = logging.getLogger("dreams_nas")

# What a profile's timings depend on besides the hardware id: rows timed under another value of
# any of these are another machine's, refused rather than merged.
FINGERPRINT = ("torch", "transformers", "driver", "cuda", "mig_profile", "power_cap_w")


def profile_fingerprint(hw: HardwareInfo, architecture_hash: str | None) -> dict[str, Any]:
    """What the predictor of these rows answers for: the hardware id, dtype, software stack
    (`FINGERPRINT`) and the target's architecture hash."""
    from dreams_nas.latency.measure.steps import STEP_REVISION

    info = hw.to_dict()
    return {"hardware_id": hw.hardware_id, "dtype": hw.dtype, "steps": hw.steps,
            "batch": hw.batch,
            **{key: info.get(key) for key in FINGERPRINT},
            "architecture_hash": architecture_hash, "step_revision": STEP_REVISION}


def check_same_target(folder: Path, where: str | Path, target_id: str) -> None:
    """Refuse to append rows of another target architecture to a profile (`where`: the
    target's checkpoint, `target_id` its name as given)."""
    from dreams_nas.supernet.target.adapter import TargetAdapter

    plan = folder / "plan.json"
    old = read_json(plan).get("architecture_hash") if plan.is_file() else None
    if not old:
        return
    new = TargetAdapter.architecture(where)
    if old != new:
        raise InputError(
            f"the profile in {folder} timed a target of architecture {old}, this target "
            f"({target_id}) is {new}: its rows would mix two models; profile it into another "
            "--run folder")


def check_same_hardware(folder: Path, hw: HardwareInfo, clock: str) -> None:
    """Refuse to append rows timed in another dtype, with another clock or on another software
    stack (`FINGERPRINT`) to a profile."""
    path = folder / "hardware.json"
    if path.is_file():
        old = read_json(path)
        if not isinstance(old, dict) or not old.get("hardware_id"):
            raise InputError(f"{path} is damaged (not the JSON object a profile writes): the "
                             f"rows in {folder} no longer say what they were timed on; delete "
                             "it and rerun `dreams-nas profile` on that machine (the rows "
                             "already timed are kept)")
        if old.get("dtype") != hw.dtype:
            raise InputError(
                f"the profile in {folder} was timed in {old.get('dtype')}, this run asks for "
                f"{hw.dtype}; pass --dtype {old.get('dtype')} or use another --run folder"
            )
        now = hw.to_dict()
        for key in FINGERPRINT:
            if key in old and old[key] != now.get(key):
                raise InputError(
                    f"the profile in {folder} was timed with {key} {old[key]}, this machine has "
                    f"{now.get(key)}: its rows would mix two machines; profile into another "
                    f"--run folder, or move {folder} aside to profile afresh")
    plan = folder / "plan.json"
    if plan.is_file() and hw.kind == "cpu":
        recorded_clock = read_json(plan).get("clock", "wall")
        if recorded_clock != clock:
            raise InputError(
                f"the profile in {folder} was timed with --clock {recorded_clock}, "
                f"this run asks for --clock {clock}; pass --clock {recorded_clock} or use "
                "another --run folder"
            )


def check_options(options: Any, device: str) -> None:
    """Refuse, before anything loads, the `ProfileOptions` that cannot be timed."""
    from dreams_nas.latency.measure.plan import parse_budget
    from dreams_nas.supernet.core.device import resolve_compile

    parse_budget(options.budget, options.budget_option)  # before the target's slow load
    if options.repeats < 1:
        raise InputError(f"--repeats {options.repeats} must be at least 1")
    if options.batch < 1:
        raise InputError(f"--batch-sizes {options.batch} must be 1 or more")
    if options.batch > 1 and options.transfer_from:
        raise InputError(f"--transfer-from prices batch 1 from another device's batch-1 "
                         f"profile; profile batch {options.batch} here in full (drop "
                         "--transfer-from), or give --batch-sizes 1")
    if options.warmup < 0:
        raise InputError(f"--warmup {options.warmup} must be 0 or more")
    if options.warmup == 0 and resolve_compile(options.compile, device) == "compiled":
        raise InputError("--warmup 0 with compiled steps: a step's first call compiles it, and "
                         "a timed sample would hold that; give --warmup 1 or more")
    if options.passes < 1:
        raise InputError(f"--passes {options.passes} must be at least 1")
    if options.chunk < 0:
        raise InputError(f"--chunk {options.chunk} must be >= 0 (0: the whole grid)")
    if options.clock not in ("wall", "cpu"):
        raise InputError(f"--clock {options.clock!r} must be wall or cpu")
    if options.clock == "cpu" and (device != "cpu" or options.threads != 1):
        raise InputError(
            "--clock cpu (thread CPU time) is for the CPU with one thread; add --device cpu "
            "--threads 1, or use --clock wall")


def static_positions(contexts: Sequence[int], keys: Sequence[Any], max_new_tokens: int) -> int:
    """The positions every static cache of a profile is made for (compiled steps): the longest
    context, an answer of `max_new_tokens` and the widest verify, as a request at that context
    reserves them; one capacity for every context, so each step's shape compiles once."""
    widest = max((int(key.k) for key in keys), default=1)
    return max(contexts, default=0) + max_new_tokens + widest


def compile_seconds(adapter: Any) -> dict[str, float]:
    """Compiled steps: the seconds each shape's first call took in this process, in the
    warm-up before its samples (its compilation): the target's (`StaticSteps.warmup_s`) and the
    drafts' (`draft_steps.WARMUP_S`); {} for eager steps."""
    from dreams_nas.supernet.decoding.draft_steps import WARMUP_S

    static = getattr(adapter, "static", None)
    if static is None or not static.compiled:
        return {}
    rows = getattr(adapter, "_rows", None)  # batched steps (`profile --batch-sizes`)
    out = {f"target:{k}": v for k, v in {**static.warmup_s,
                                          **(rows.warmup_s if rows else {})}.items()}
    out.update({f"draft:{k}": v for k, v in WARMUP_S.items()})
    return {k: round(v, 2) for k, v in out.items()}


def log_compile(seconds: dict[str, float]) -> None:
    """One log line on the compilation a compiled profile paid in its warm-ups."""
    if seconds:
        values = sorted(seconds.values())
        log.info("compiled %d shapes in the warm-ups: %.0f s in all, %.1f s a shape (median), "
                 "%.1f s at most", len(values), sum(values), values[len(values) // 2],
                 values[-1])


def log_accuracy(by_kind: dict[str, dict[str, float]], what: str = "predictor, held-out"
                 ) -> None:
    """One log line per kind of step: how well the predictor fitted without them predicted the
    held-out rows (MAPE, share within +-10 %, Kendall's tau); `what` names the rows."""
    for kind, m in by_kind.items():
        tau = m.get("kendall_tau", float("nan"))
        log.info(f"{what} %s rows (%d): MAPE %.1f%%, within 10%% %.0f%%, "
                 "Kendall tau %s", kind, int(m.get("n", 0)), 100 * m.get("mape", float("nan")),
                 100 * m.get("within_10pct", float("nan")),
                 "n/a" if tau != tau else f"{tau:.3f}")


def warn_partial_fit(store: ProfileStore, fitted: int, plan_path: Path) -> str | None:
    """Warn (and return the warning) when the predictor was fitted on fewer rows than the plan
    has steps: a torn last line is skipped on reading, and `--fit-only` times nothing, so
    without this the fit would silently rest on part of the grid."""
    plan = read_json(plan_path) if plan_path.is_file() else {}
    planned = int(plan.get("n_keys", 0)) if isinstance(plan, dict) else 0
    if fitted >= planned:
        return None
    recorded = len(store.done_keys())
    if recorded < planned:
        warning = (f"fitted {fitted} of {planned} planned steps; rerun `dreams-nas profile` "
                   "without --fit-only to time the missing ones")
    else:
        warning = (f"fitted {fitted} of {planned} planned steps; the others could not be "
                   f"timed (status oom or failed in {store.path})")
    log.warning("warning: %s", warning)
    return warning
