"""`benchmarks/gpu_check.sh`'s CPU dry run: the GPU check's compiled, batch and float32 passes
run and print what a device run records, on the tiny built-in target (the session's), the compiled
steps in dynamo's capture (`DREAMS_NAS_COMPILE_BACKEND=eager`): the plumbing, not the figures.
The eager 16-bit pass is the compiled one with `--compile off` (the demo's tests run that path
in bfloat16); leaving it out keeps the suite's time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


@pytest.mark.slow  # trains once, profiles, scores and searches three times at test size
def test_the_gpu_check_dry_run_prints_each_pass(tmp_path, builtin_cache) -> None:
    env = {**os.environ, "DREAMS_NAS_CACHE": str(builtin_cache), "PY": sys.executable,
           "DREAMS_NAS_COMPILE_BACKEND": "eager", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--no-tests", "--passes",
                           "compiled batch fp32", "--out", str(tmp_path)], cwd=SCRIPT.parents[1],
                          env=env, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    hardware = re.findall(r"^hardware id\s+(\S+)", out, re.M)
    # 16-bit compiled (its own id), the same at a batch of 2 (another), then float32 eager
    assert hardware == [f"{hardware[2]}-compiled", f"{hardware[2]}-compiled-b2",
                        hardware[2]], out
    assert len(re.findall(r"^hardware id\s+\S+\s+\(.*, batch 2\)", out, re.M)) == 1, out
    assert len(re.findall(r"^identical prompts\s+\d+ of \d+", out, re.M)) == 3, out
    assert len(re.findall(r"^speedup\s+predicted [\d.]+x, measured [\d.]+x", out, re.M)) == 3
    assert len(re.findall(r"^draft step\s+predicted [\d.]+ ms", out, re.M)) == 3
    # the best chain against the best tree after the 16-bit pass, decoded compiled
    assert len(re.findall(r"^tree / chain measured: [\d.]+x", out, re.M)) == 1, out
    assert "compiled steps" in out
    assert "--device cuda:99" in out or "cuda:99" in out  # the one-line error, printed
    assert "Traceback" not in out + proc.stderr
    # the compiled profile reports each shape's compilation, paid in the warm-ups
    compiled = json.loads((tmp_path / "run-16bit.profile.json").read_text())["compile_s"]
    assert any(k.startswith("target:") for k in compiled), compiled
    assert any(k.startswith("draft:") for k in compiled), compiled
