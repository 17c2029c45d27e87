"""The chosen subnet's cost parts re-timed while the search verifies it.

A search predicts a speedup from the profile's step times and measures it minutes (or days)
later. On a machine whose speed changes in between -- a shared VM whose neighbours come and go,
a GPU that throttles -- the steps do not all change alike (a busy hour slows a draft's small
steps more than the target's larger ones), so the ratio the formula forms moves, and the gap
between prediction and measurement mixes two things: the formula's error, and the machine's
change since the profile.

This module separates them. Before each prompt the verification decodes (and after the last) it
times the best subnet's steps again, a couple of repeats each, with the profile's own step
builder (`latency.measure.steps.ModelSteps`, the same keys the predictor priced: its draft and
first draft step, the verify over draft_len + 1 positions after the largest subnet's draft
steps, a plain decoding step, the cycle's own work) at the search's context -- so the re-timed
steps see the same changes of the machine's speed as the decoding beside them -- and prices the
same formula with their medians. Its gap to the measured speedup is the formula's error with the
machine as it is now; each part's ratio to the profile's prediction is the machine's drift since
the profile. Chains only: a token tree's steps are not re-timed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from dreams_nas.nas.search.candidate import Candidate

# A part this much slower or faster than the profile priced it: the profile is stale.
DRIFT_WARN = 0.15
PARTS = ("decode_ms", "verify_ms", "draft_ms", "first_draft_ms", "cycle_overhead_ms")


@dataclass
class Retimer:
    """Re-times `candidate`'s parts at `context_len` each time it is called."""

    steps: Any  # a `latency.measure.steps.ModelSteps`
    candidate: Candidate
    context_len: int
    max_draft_len: int  # the space's deepest chain: the draft rows' canonical draft_len
    device: str = "cpu"
    threads: int | None = None
    repeats: int = 2  # timed repeats of each step per call (one call per prompt decoded)
    warmup: int = 1
    samples: dict[str, list[float]] = field(default_factory=dict)

    def keys(self) -> dict[str, Any]:
        """The profile's keys of each part (`latency.measure.plan`)."""
        from dreams_nas.latency.measure.plan import StepKey

        spec, ctx = self.candidate.spec, self.context_len
        canonical = spec.replace(draft_len=self.max_draft_len)
        k = spec.draft_len + 1
        keys = {"decode_ms": StepKey("decode", ctx, 1),
                "verify_ms": StepKey("verify", ctx, k),
                "draft_ms": StepKey("draft", ctx, 1, canonical),
                "first_draft_ms": StepKey("draft_first", ctx, 1, canonical)}
        if self.candidate.cycle_overhead_ms > 0:  # priced by the profile: re-timed too
            keys["cycle_overhead_ms"] = StepKey("cycle", ctx, k)
        return keys

    def __call__(self, _call: int = 0) -> None:
        from dreams_nas.latency.measure.timing import Repeats, measure

        for part, key in self.keys().items():
            # built again every call: a target step starts from the profile's kept prefill,
            # which the decoding since the last call has swapped out of the adapter
            step = self.steps.build(key)
            repeats = Repeats(warmup=self.warmup, min_repeats=self.repeats,
                              max_repeats=self.repeats, budget_s=1e-3)
            timing = measure(step.run, repeats, device=self.device, threads=self.threads,
                             prepare=step.prepare, excluded=step.excluded)
            self.samples.setdefault(part, []).extend(timing.samples_ms)

    def parts(self) -> dict[str, float]:
        """Each part's median over every re-timing so far (ms); the profile's where a part was
        not re-timed (an unpriced cycle overhead stays 0)."""
        out = {part: float(getattr(self.candidate, part)) for part in PARTS}
        out.update({part: statistics.median(v) for part, v in self.samples.items() if v})
        return out

    def summary(self, measured_speedup: float) -> dict[str, Any]:
        """The re-timed parts, their drift from the profile's prediction, the formula's speedup
        with them and its gap to `measured_speedup` (percent, as `verify.speedup_gap`)."""
        from dreams_nas.nas.search.speedup import expected_speedup

        cand, now = self.candidate, self.parts()
        speedup = float(expected_speedup(cand.tau, cand.spec.draft_len, now["draft_ms"],
                                         now["verify_ms"], now["decode_ms"],
                                         first_draft_ms=now["first_draft_ms"],
                                         cycle_overhead_ms=now["cycle_overhead_ms"]))
        drift = {part: (now[part] / getattr(cand, part) - 1.0) * 100.0
                 for part in self.samples if getattr(cand, part) > 0}
        return {"ms": {p: round(v, 4) for p, v in now.items()},
                "drift_pct": {p: round(v, 1) for p, v in drift.items()},
                "speedup": speedup,
                "gap_pct": (measured_speedup - speedup) / speedup * 100.0,
                "samples": min((len(v) for v in self.samples.values()), default=0),
                "context_len": self.context_len}


def build_retimer(run: Any, models: Any, candidate: Candidate, context_len: int,
                  hardware: dict[str, Any], space: Any) -> Retimer | None:
    """A `Retimer` of `candidate` on the run's models with its profile's builder settings
    (plan.json: the visual tokens, the subnet whose draft steps precede a verify); None for a
    token tree or a run whose profile plan is missing (nothing to re-time against)."""
    from dreams_nas.latency.measure.steps import ModelSteps
    from dreams_nas.supernet.core.io import read_json
    from dreams_nas.supernet.core.spec import SubnetSpec

    if candidate.spec.is_tree:
        return None
    plan_path = run.plan_json(hardware["hardware_id"])
    if not plan_path.is_file():
        return None
    plan = read_json(plan_path)
    after = plan.get("verify_after")
    precede = SubnetSpec.from_id(after) if after else space.largest()
    static = getattr(models.target, "static", None)  # compiled steps: the decoding's capacity
    steps = ModelSteps(models.target, models.draft, int(plan.get("visual_tokens", 0)),
                       seed=int(plan.get("seed", 0)), precede=precede,
                       positions=static.floor if static is not None else 0)
    device = models.device
    threads = hardware.get("threads") if device.split(":")[0] == "cpu" else None
    return Retimer(steps, candidate, int(context_len), max(space.draft_len), device=device,
                   threads=int(threads) if threads else None)


def retime_lines(summary: dict[str, Any], candidate: Candidate) -> tuple[str, str | None]:
    """The log line of a re-timing, and a warning when the machine drifted past `DRIFT_WARN`
    since the profile (None otherwise)."""
    names = {"decode_ms": "decode", "verify_ms": "verify", "draft_ms": "draft",
             "first_draft_ms": "first draft", "cycle_overhead_ms": "cycle overhead"}
    parts = ", ".join(f"{names[p]} {summary['ms'][p]:.3g} ms ({drift:+.0f}%)"
                      for p, drift in summary["drift_pct"].items())
    line = (f"{candidate.spec.id}: its steps re-timed among the prompts ({parts} against the "
            f"profile); the formula with them predicts {summary['speedup']:.2f}x "
            f"({summary['gap_pct']:+.1f}% to the measured)")
    worst = max(summary["drift_pct"].items(), key=lambda kv: abs(kv[1]), default=None)
    if worst is None or abs(worst[1]) <= DRIFT_WARN * 100:
        return line, None
    return line, (f"this machine's {names[worst[0]]} step now takes {worst[1]:+.0f}% against "
                  "the latency profile: the machine changed since it was profiled, and the "
                  "predicted speedups with it; rerun `dreams-nas profile` to price its present "
                  "state")

