"""dreams_nas.latency: what each step of a speculative cycle costs on one device.

Two rooms, apart: `measure` (the device's identity, the real model steps, the plan of what to
time, the timing, its order and passes, the profile's rows) and `model` (the latency predictor
fitted on those rows and the one query interface a search asks). Both speak the step kinds of
`kinds`. The public face::

    detect_hardware(device, dtype, threads) -> HardwareInfo      # hardware.json, hardware_id
    build_plan(space, context_lengths, budget=...) -> [StepKey]   # what to time
    ProfileStore(path).append(rows) / .read() / .done_keys()      # profile.csv
    run_profile(builder, keys, store, hw, settings)               # time + append, resumable
    LatencyPredictor.fit(rows, hardware_id) / .load(folder)       # a LatencyModel:
                                                                  # draft_ms, target_ms, prices
"""

from __future__ import annotations

from dreams_nas.latency.measure.hardware import HardwareInfo, detect_hardware
from dreams_nas.latency.measure.plan import StepKey, build_plan
from dreams_nas.latency.measure.profile_store import PROFILE_COLUMNS, ProfileStore
from dreams_nas.latency.measure.profiler import StepBuilder, TimingSettings, run_profile
from dreams_nas.latency.measure.timing import Timing
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.latency.model.query import LatencyModel

__all__ = [
    "PROFILE_COLUMNS", "HardwareInfo", "LatencyModel", "LatencyPredictor", "ProfileStore",
    "StepBuilder", "StepKey", "Timing", "TimingSettings", "build_plan", "detect_hardware",
    "run_profile",
]
