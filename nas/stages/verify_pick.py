"""Verify the search's pick end to end: the best subnet and the top of its front decoded
against plain decoding on the profiled machine, with the steps re-timed among the prompts."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from dreams_nas.supernet.core.runfolder import RunFolder

if TYPE_CHECKING:  # the search stage calls this module
    from dreams_nas.nas.stages.search import SearchOptions

log = logging.getLogger("dreams_nas")


def verify_best(options: SearchOptions, result: Any, models: Any, scorer: Any,
                hardware: dict[str, Any], retime: tuple[RunFolder, int, Any] | None = None
                ) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """Measure the best subnet and the top of the front end to end against plain decoding.
    `retime`: (the run, the search's context, the space) to time the best subnet's steps
    again among the prompts (`retime`: the formula with the machine as it is now)."""
    from dreams_nas.nas.stages.verify import gap_line, gap_warning, speedup_gap
    from dreams_nas.supernet.core.device import torch_threads

    if options.verify == 0:
        return None, [], []
    here = models.device.split(":")[0]
    profiled = hardware["hardware_id"]  # hardware.json, checked by `hardware_identity`
    this = this_machine(models.device, hardware)
    if this != profiled:
        warning = (f"not verified: the latency profile is of {profiled} and this run decodes on "
                   f"{this} ({models.device}); run the search there to measure the speedup")
        log.warning("warning: %s", warning)
        return None, [], [warning]
    chosen = [result.best] + [c for c in result.front if c.spec != result.best.spec]
    chosen = chosen[: options.verify]
    prompts = scorer.prompts[: options.verify_prompts]
    batch = int(hardware.get("batch") or 1)
    log.info("verifying %d subnet(s) end to end on %d prompts against plain decoding, %d "
             "repeat(s)%s", len(chosen), len(prompts), options.verify_repeats,
             f", {batch} requests at a time" if batch > 1 else "")
    threads = hardware.get("threads") if here == "cpu" else None
    deploy_steps(models.target, hardware, prompts, [c.spec for c in chosen],
                 options.max_new_tokens)  # before the retimer: it times the same steps
    retimer = None
    if retime is not None and options.retime and batch == 1:  # retiming times batch-1 steps
        from dreams_nas.nas.stages.retime import build_retimer

        run, context_len, space = retime
        retimer = build_retimer(run, models, result.best, context_len, hardware, space)
    with torch_threads(int(threads) if threads else None):  # the profile's setting
        results = _measure(options, models, [c.spec for c in chosen], prompts, batch, retimer)
    verified, warnings = [], []
    for cand, m in zip(chosen, results, strict=True):
        verified.append(_verified(cand, m))
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
    measured = _measured(best, gap, str(models.target.dtype).removeprefix("torch."),
                         options.max_new_tokens)
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


def _measure(options: SearchOptions, models: Any, specs: list[Any], prompts: Any, batch: int,
             retimer: Any) -> list[Any]:
    """`verify.measure_end_to_end`, or at batch B > 1 `verify_batch.measure_batched`."""
    if batch > 1:
        from dreams_nas.nas.stages.verify_batch import measure_batched

        return measure_batched(models.target, models.draft, specs, prompts, batch=batch,
                               max_new_tokens=options.max_new_tokens,
                               repeats=options.verify_repeats)
    from dreams_nas.nas.stages.verify import measure_end_to_end

    return measure_end_to_end(models.target, models.draft, specs, prompts,
                              max_new_tokens=options.max_new_tokens,
                              repeats=options.verify_repeats,
                              show_progress=options.show_progress, between=retimer)


def this_machine(device: str, profiled: dict[str, Any]) -> str:
    """The hardware id of `device` here, identified as the profile was (its dtype, and on the
    CPU its thread count)."""
    from dreams_nas.latency.measure.hardware import detect_hardware

    threads = profiled.get("threads") if device.startswith("cpu") else None
    return detect_hardware(device, dtype=str(profiled.get("dtype") or "float32"),
                           threads=int(threads) if threads else None,
                           steps=str(profiled.get("steps") or "dynamic"),
                           batch=int(profiled.get("batch") or 1)).hardware_id


def deploy_steps(target: Any, hardware: dict[str, Any], prompts: Any, specs: Any,
                 max_new_tokens: int) -> None:
    """Decode as the profile timed: its steps (hardware.json's ``steps``), and for static
    steps one cache capacity for every prompt (the longest prompt, the answer and the widest
    verify), so no shape is compiled again mid-measurement."""
    target.use_steps(str(hardware.get("steps") or "dynamic"))
    if target.static is not None:
        longest = max(int(p["input_ids"].shape[-1]) for p in prompts)
        widest = max(s.shape.nodes + 1 for s in specs)
        target.static.floor = longest + max_new_tokens + widest


def _verified(cand: Any, m: Any) -> dict[str, Any]:
    """best.json's `verified` entry of one measured candidate."""
    from dreams_nas.nas.stages.verify import speedup_gap

    return {"spec_id": cand.spec.id, "predicted_speedup": cand.speedup,
            "measured_speedup": m.speedup, "measured_speedup_range": list(m.speedup_range),
            "repeat_speedups": list(m.repeat_speedups),
            "gap_pct": speedup_gap(cand, m)["gap_pct"],
            "measured_speedup_end_to_end": m.speedup_end_to_end, "measured_tau": m.tau,
            "predicted_tau": cand.tau, "tokens_per_s": m.tokens_per_s,
            "baseline_tokens_per_s": m.baseline_tokens_per_s,
            "decode_tokens_per_s": m.decode_tokens_per_s,
            "baseline_decode_tokens_per_s": m.baseline_decode_tokens_per_s,
            "measured_ms": {"draft": m.draft_ms, "verify": m.verify_ms,
                            "loop_overhead": m.other_ms, "decode": m.decode_ms},
            "identical_prompts": m.identical_prompts}


def _measured(best: Any, gap: dict[str, Any], dtype: str, max_new_tokens: int
              ) -> dict[str, Any]:
    """best.json's `measured` block of the best subnet's measurement."""
    return {"speedup": best.speedup, "speedup_range": list(best.speedup_range),
            "repeats": len(best.repeat_speedups), "repeat_speedups": list(best.repeat_speedups),
            "speedup_end_to_end": best.speedup_end_to_end,
            "predicted_speedup": gap["predicted_speedup"], "gap_pct": gap["gap_pct"],
            "tau": best.tau, "tokens_per_s": best.tokens_per_s,
            "baseline_tokens_per_s": best.baseline_tokens_per_s,
            "decode_tokens_per_s": best.decode_tokens_per_s,
            "baseline_decode_tokens_per_s": best.baseline_decode_tokens_per_s,
            "prompts": best.prompts, "identical_prompts": best.identical_prompts,
            "divergences": [asdict(d) for d in best.divergences],
            "drift_ulps": best.drift_ulps, "dtype": dtype,
            "max_new_tokens": max_new_tokens}
