#!/usr/bin/env bash
# The latency GPU check, for a machine with an NVIDIA GPU (a few minutes):
#   1. the cuda-marked latency tests (NVML identity, CUDA-event timing, profiling on cuda:0);
#   2. `dreams-nas profile --device cuda:0` on a tiny LLaVA, then the predictor's metrics;
#   3. the one-line error for a GPU index that does not exist.
set -euo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
$PY -m pytest -q -m cuda tests/latency
$PY - "$OUT/tiny-llava" <<'PYEOF'
import sys
sys.path.insert(0, "tests/latency")
from conftest import save_tiny_llava
save_tiny_llava(sys.argv[1])
PYEOF
$PY -m dreams_nas.nas.cli profile --run "$OUT/run" --target "$OUT/tiny-llava" --device cuda:0 \
    --repeats 20 --context-lengths 36 68 132 260 --json
cat "$OUT"/run/latency/*/hardware.json
if $PY -m dreams_nas.nas.cli profile --run "$OUT/run" --device cuda:99 2>"$OUT/err"; then
    echo "cuda:99 should have failed" >&2; exit 1
fi
cat "$OUT/err"
