"""`benchmarks/gpu_check.sh`'s CPU dry run: every stage of the GPU check runs and prints what a
device run records, on the tiny built-in target (the session's) with the compiled pass in
dynamo's capture (`DREAMS_NAS_COMPILE_BACKEND=eager`): the plumbing, not the figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


@pytest.mark.slow  # trains, profiles, scores and searches three times at test size
def test_the_gpu_check_dry_run_prints_each_pass(tmp_path, builtin_cache) -> None:
    env = {**os.environ, "DREAMS_NAS_CACHE": str(builtin_cache), "PY": sys.executable,
           "DREAMS_NAS_COMPILE_BACKEND": "eager", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--no-tests", "--out",
                           str(tmp_path)], cwd=SCRIPT.parents[1], env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    hardware = re.findall(r"^hardware id\s+(\S+)", out, re.M)
    # 16-bit eager, the same compiled (its own id), float32
    assert len(hardware) == 3 and hardware[1] == f"{hardware[0]}-compiled", out
    assert len(re.findall(r"^identical prompts\s+\d+ of \d+", out, re.M)) == 3, out
    assert len(re.findall(r"^speedup\s+predicted [\d.]+x, measured [\d.]+x", out, re.M)) == 3
    assert len(re.findall(r"^draft step\s+predicted [\d.]+ ms", out, re.M)) == 3
    # the best chain against the best tree, eager and compiled
    assert len(re.findall(r"^tree / chain measured: [\d.]+x", out, re.M)) == 2, out
    assert "compiled steps" in out and "dynamic steps" in out
    assert "--device cuda:99" in out or "cuda:99" in out  # the one-line error, printed
    assert "Traceback" not in out + proc.stderr
