#!/usr/bin/env bash
# One lent GPU machine's checks, run from the repository root (docs/engine.md, "CUDA"): install
# onnxruntime-gpu in place of onnxruntime from a carried archive, then the gpu-marked tests, the
# families speed and fidelity check (research/cuda_check.py), the bench's cuda rows and sweeps, and
# PyTorch's fp16 attention on new shapes. Each step has its own time limit and log; a failed step
# does not stop the next. Logs and reports go to $OUT/results.tgz.
#
#   ORT_ARCHIVE=/tmp/parts/ortgpu.tar.xz EXTRA_SITE=/tmp/parts/site bash research/cuda_session.sh
#
# GPU_TESTS: the test files to run (default: every gpu-marked file); STEPS: the steps to run
# (default: all of them, in this order).
# ORT_ARCHIVE: onnxruntime-gpu's unpacked wheel as tar.xz (its onnxruntime/ and *.dist-info/);
# EXTRA_SITE: packages the machine lacks, copied into site-packages as they are.
set -u
OUT=${OUT:-/tmp/cuda-session}
WORK=/tmp/cuda-session-work
mkdir -p "$OUT" "$WORK/logs"
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export SITE ORT_ARCHIVE EXTRA_SITE=${EXTRA_SITE:-}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

STEPS=${STEPS:-install gpu_tests families bench torch_attention sweeps}

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, record rc and seconds
    local name=$1 limit=$2 started rc
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    started=$(date +%s)
    timeout "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - started ))s" | tee -a "$WORK/logs/steps.txt"
    tail -n 4 "$WORK/logs/$name.log"
    tar -czf "$OUT/results.tgz" -C "$WORK" logs reports 2>/dev/null
}
mkdir -p "$WORK/reports"

install() {
    python3 -m pip uninstall -y -q onnxruntime
    tar -xJf "$ORT_ARCHIVE" -C "$SITE"
    if [ -n "$EXTRA_SITE" ]; then cp -r "$EXTRA_SITE"/. "$SITE"/; fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import onnxruntime as o, torch; print(o.__version__, o.get_available_providers(), torch.__version__)'
}
export -f install
step install 120 bash -c install

step gpu_tests 240 python3 -m pytest -m gpu -p no:cacheprovider -n 5 --dist loadfile -rs \
    --junitxml="$WORK/reports/gpu_tests.xml" ${GPU_TESTS:-tests/engine/test_cuda.py \
    tests/late_interaction/test_late_cuda.py tests/decoder/test_t5_cuda.py \
    tests/decoder/test_decoder_cuda.py tests/bench/test_bench_runs.py}

step families 150 python3 research/cuda_check.py families --work /tmp/cuda-check \
    --out "$WORK/reports/bert.json" --families bert --fp16-max-abs-diff 0.25 --rounds 40

step bench 240 python3 -m onnxrank bench --model /tmp/cuda-check/full/models/bert --device cuda \
    --scenarios latency,throughput,peers --regimes short,mixed --queries 20 \
    --out "$WORK/reports/bench"
step torch_attention 120 python3 research/cuda_check.py torch-attention \
    --checkpoint /tmp/cuda-check/full/checkpoints/bert --out "$WORK/reports/torch_attention.json"

step sweeps 170 python3 -m onnxrank bench --model /tmp/cuda-check/full/models/bert --device cuda \
    --scenarios sweeps --queries 12 --out "$WORK/reports/sweeps"
cat "$WORK/logs/steps.txt"
