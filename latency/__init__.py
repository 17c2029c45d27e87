"""dreams_nas.latency: hardware identity, timing, the profile store and the latency predictor.

The public face (heavier pieces -- the model step builder, the profile pipeline -- are imported
from their modules: `dreams_nas.latency.steps`, `dreams_nas.nas.stages.profile`)::

    detect_hardware(device, dtype, threads) -> HardwareInfo      # hardware.json, hardware_id
    measure(step, device=..., prepare=None) -> Timing            # warm-up, repeats, median/p10/p90
    build_plan(space, context_lengths, budget=...) -> [StepKey]   # what to time
    ProfileStore(path).append(rows) / .read() / .done_keys()      # profile.csv
    run_profile(builder, keys, store, hw, settings)               # time + append, resumable
    LatencyPredictor.fit(rows, hardware_id) / .load(folder)       # draft_ms, first_draft_ms,
                                                                  # decode_ms, verify_ms,
                                                                  # context_range, check_context
    StepLatencyModel                                              # one model per step kind
"""

from __future__ import annotations

from dreams_nas.latency.estimators import (
    CVSelectedRegressor,
    DraftFeatures,
    RelativeRidge,
    latency_metrics,
)
from dreams_nas.latency.hardware import HardwareInfo, detect_hardware
from dreams_nas.latency.plan import StepKey, build_plan
from dreams_nas.latency.predictor import LatencyPredictor
from dreams_nas.latency.profiler import StepBuilder, TimingSettings, run_profile
from dreams_nas.latency.step_model import StepLatencyModel, make_latency_model
from dreams_nas.latency.store import PROFILE_COLUMNS, ProfileStore
from dreams_nas.latency.timing import Timing, measure

__all__ = [
    "PROFILE_COLUMNS", "CVSelectedRegressor", "DraftFeatures", "HardwareInfo", "LatencyPredictor",
    "ProfileStore", "RelativeRidge", "StepBuilder", "StepKey", "StepLatencyModel", "Timing",
    "TimingSettings", "build_plan", "detect_hardware", "latency_metrics", "make_latency_model",
    "measure", "run_profile",
]
