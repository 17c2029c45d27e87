#!/usr/bin/env bash
# The GPU check: the CUDA paths end to end on one device, a few minutes on one GPU.
#
#   benchmarks/gpu_check.sh                 # cuda:0, the default built-in target
#   benchmarks/gpu_check.sh --device cpu    # the dry run: the tiny built-in target on the CPU
#   (--no-tests skips step 1, --passes a subset of "eager compiled batch fp32"; the suite's dry
#   run, tests/nas/test_gpu_check.py, runs the compiled, batch and float32 passes with
#   DREAMS_NAS_COMPILE_BACKEND=eager: dynamo's capture without inductor's code generation)
#
# 1. the cuda-marked tests (skipped where torch sees no GPU);
# 2. on the device: build the built-in target (cached), train a supernet briefly in the 16-bit
#    dtype the device runs natively (--dtype auto: bfloat16 from compute capability 8.0,
#    float16 before; bfloat16 in the CPU dry run), profile, score, search and verify the best
#    subnet end to end against plain greedy decoding; then the same supernet's weights in a
#    float32 copy of the run folder (no second training), profiled, scored and searched again,
#    where the speculative output must equal plain greedy decoding on every prompt;
#    the 16-bit run is profiled and searched twice: its steps eager, then compiled (--compile on:
#    CUDA graphs; its own hardware id, <id>-compiled), side by side, and after each its best
#    chain and its best token tree decode side by side (benchmarks/bench_trees.py: where a wide
#    verify is nearly free, trees should win: the goal is the best tree >= 1.10x the chain);
#    then (--passes batch) profiled and searched compiled at a batch of 8 requests (`profile
#    --batch-sizes 8`, `<id>-compiled-b8`), its pick verified batched against plain batched
#    decoding, beside the compiled pass's batch 1;
# 3. prints per run the hardware id, the identical-prompt rate, predicted vs measured speedup
#    and the draft and target step times; then checks the one-line error for a device that is
#    not there.
# Record what it prints in BENCHMARKS.md with the GPU's name. On an H200 it should take about 8
# minutes (estimated from the stage times of the first GPU run, with the built-in target carried in
# a built $DREAMS_NAS_CACHE; building it there adds minutes).
set -euo pipefail
DEVICE=cuda:0
VARIANT=""
OUT=""
TESTS=1
PASSES="eager compiled batch fp32"
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --variant) VARIANT=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --no-tests) TESTS=0; shift ;;
        --passes) PASSES=$2; shift 2 ;;
        *) echo "gpu_check.sh: unknown argument $1 (--device D, --variant V, --out DIR," \
                "--no-tests, --passes 'eager compiled batch fp32')" >&2
           exit 2 ;;
    esac
done
if [ -z "$VARIANT" ]; then  # the CPU dry run checks the plumbing on the test-size target
    case "$DEVICE" in cpu) VARIANT=tiny ;; *) VARIANT=default ;; esac
fi
PY=${PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
CLI=("$PY" -m dreams_nas.nas.cli)
export DREAMS_NAS_DEMO_VARIANT=$VARIANT
if [ "$VARIANT" = tiny ]; then  # test-size settings: the plumbing, not the figures
    STEPS=2; PROMPTS=4; LIMIT=2; TOKENS=8; CONTEXTS=(40 56); BUDGET=(4 4); REPEATS=(2 1 1)
    TREE_REPEATS=1; VERIFY_REPEATS=1; BATCH=2
else  # a GPU runs a model this small at its launch rate: ~0.7 s a training step, ~1 s a row
    STEPS=100; PROMPTS=128; LIMIT=16; TOKENS=48; CONTEXTS=(); BUDGET=(24 8); REPEATS=(10 2 3)
    TREE_REPEATS=3; VERIFY_REPEATS=3; BATCH=8
fi
started=$(date +%s)

if [ "$TESTS" = 1 ]; then
    echo "== cuda-marked tests"
    "$PY" -m pytest -q -m cuda tests
fi

case "$DEVICE" in cpu) HALF=bfloat16 ;; *) HALF=auto ;; esac

stage() {  # stage NAME COMMAND...: run one stage, then say how long it took
    local name=$1 t0
    shift
    t0=$(date +%s)
    "$@"
    echo "($name: $(( $(date +%s) - t0 )) s)" >&2
}

pipeline() {  # pipeline RUN BUDGET LIMIT [COMPILE [BATCH]]: profile (its steps eager, or
    # compiled with COMPILE=on; at BATCH requests a step: each a hardware id of its own), score,
    # search into RUN; best.json's summary
    local run=$1 budget=$2 limit=$3 compile=${4:-off} batch=${5:-1} hw tag=""
    if [ "$batch" != 1 ]; then tag=".b$batch"; fi
    stage profile "${CLI[@]}" profile --run "$run" --device "$DEVICE" --repeats "${REPEATS[0]}" \
        --passes "${REPEATS[1]}" --warmup "${REPEATS[2]}" \
        --budget "$budget" ${CONTEXTS[@]:+--context-lengths "${CONTEXTS[@]}"} \
        --compile "$compile" --batch-sizes "$batch" --json -q > "$run$tag.profile.json"
    hw=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["hardware_id"])' \
        "$run$tag.profile.json")
    stage score "${CLI[@]}" score --run "$run" --device "$DEVICE" --limit "$limit" \
        --max-new-tokens "$TOKENS" --json -q
    stage search "${CLI[@]}" search --run "$run" --device "$DEVICE" --objective speedup \
        --hardware "$hw" --limit "$limit" --max-new-tokens "$TOKENS" --verify 1 \
        --verify-repeats "$VERIFY_REPEATS" --json -q \
        > "$run$tag.search.json"
    "$PY" - "$run" "$run$tag.search.json" <<'PYEOF'
import json
import sys
from pathlib import Path

run, search = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
best = json.loads((run / "search" / search["hardware_id"] / "best.json").read_text())
predicted, measured = best["predicted"], best["measured"] or {}
verified = (best["verified"] or [{}])[0]
steps = verified.get("measured_ms", {})
print(f"hardware id        {search['hardware_id']}  ({best['hardware'].get('name')}, batch "
      f"{best['hardware'].get('batch', 1)})")
print(f"dtype              {best['dtype']}")
print(f"best subnet        {best['spec_id']}")
print(f"identical prompts  {measured.get('identical_prompts')} of {measured.get('prompts')}")
repeats = measured.get("repeat_speedups") or []
print(f"speedup            predicted {predicted['speedup']:.2f}x, measured "
      f"{measured.get('speedup', float('nan')):.2f}x (decode phase; median of the repeats "
      + " / ".join(f"{x:.2f}" for x in repeats) + ")")
print(f"draft step         predicted {predicted['draft_ms']:.3f} ms (first "
      f"{predicted['first_draft_ms']:.3f}), measured {steps.get('draft', float('nan')):.3f} ms")
print(f"target step        predicted decode {predicted['decode_ms']:.3f} ms, verify "
      f"{predicted['verify_ms']:.3f} ms; measured decode {steps.get('decode', float('nan')):.3f}"
      f" ms, verify {steps.get('verify', float('nan')):.3f} ms")
if best["dtype"] == "float32" and measured.get("identical_prompts") != measured.get("prompts"):
    sys.exit("float32 decoding is not lossless: every prompt must be identical")
PYEOF
    if [ "$run" = "$HALF_RUN" ] && [ "$batch" = 1 ]; then  # best chain vs best tree
        stage trees "$PY" benchmarks/bench_trees.py --run "$run" --hardware "$hw" \
            --device "$DEVICE" --prompts "$limit" --max-new-tokens "$TOKENS" \
            --repeats "$TREE_REPEATS"
    fi
}

"${CLI[@]}" target build-builtin --variant "$VARIANT" --json
HALF_RUN=$OUT/run-16bit
FP32_RUN=$OUT/run-fp32
echo "== on $DEVICE (built-in target variant $VARIANT, --dtype $HALF) into $HALF_RUN"
stage train "${CLI[@]}" train --run "$HALF_RUN" --device "$DEVICE" --dtype "$HALF" \
    --n-train "$PROMPTS" --warmup-steps "$STEPS" --multires-steps "$STEPS" \
    --max-new-tokens "$TOKENS" --json -q
runs() { case " $PASSES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if runs eager; then
    pipeline "$HALF_RUN" "${BUDGET[0]}" "$LIMIT"
fi
if runs compiled; then
    echo "== on $DEVICE, the same supernet and dtype, the steps compiled (--compile on)"
    pipeline "$HALF_RUN" "${BUDGET[0]}" "$LIMIT" on
fi
if runs batch; then
    echo "== on $DEVICE, the same supernet and dtype, compiled, $BATCH requests at a time"
    pipeline "$HALF_RUN" "${BUDGET[0]}" "$(( LIMIT > BATCH ? LIMIT : BATCH ))" on "$BATCH"
fi
if runs fp32; then
echo "== on $DEVICE, the same supernet in float32, into $FP32_RUN"
"$PY" - "$HALF_RUN" "$FP32_RUN" <<'PYEOF'
import json
import shutil
import sys
from pathlib import Path

half, fp32 = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(half / "supernet", fp32 / "supernet",
                ignore=shutil.ignore_patterns("features", "checkpoint"))
run = json.loads((half / "run.json").read_text())
run["dtype"] = "float32"
(fp32 / "run.json").write_text(json.dumps(run, indent=2))
PYEOF
pipeline "$FP32_RUN" "${BUDGET[1]}" "$(( (LIMIT + 1) / 2 ))"
fi
echo "took               $(( $(date +%s) - started )) s"

echo "== a device that is not there"
if "${CLI[@]}" profile --run "$OUT/run-16bit" --device cuda:99 2> "$OUT/err"; then
    echo "--device cuda:99 should have failed" >&2
    exit 1
fi
cat "$OUT/err"
