#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run: the kernel tests compiled (no interpreter), the
# kernel benchmark, a short training run on the device and `atlas bench --device cuda`.
#
#     bash scripts/gpu_check.sh OUT_DIR [STAGES]
#
# STAGES: a comma list of env,fla,tests,kernels,train,bench,compile (default: all; compile last: the
# ahead-of-time sm_90 compile check recompiles every configuration under a Triton release whose
# rows docs/kernel_resources_sm90.json does not hold, minutes in all). Every stage writes its log
# (and JSON where it has one) into OUT_DIR; a stage that fails does not stop the next one, and the
# script exits non-zero when any stage failed. Each stage has a time limit (seconds, ATLAS_GPU_T_*).
# fla: `atlas fla certify` (the conformance kit on flash-linear-attention's real chunk kernels;
# needs fla-core and flash-linear-attention installed). ATLAS_GPU_BENCH_ARGS: more arguments for
# `atlas bench` (e.g. "--lengths 512,2048 --budget 15").
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [STAGES]}
stages=${2:-env,tests,kernels,train,bench,compile}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
failed=()

stage() {  # stage NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    case ",$stages," in *",$name,"*) ;; *) return 0 ;; esac
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || failed+=("$name")
}

stage env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; \
    $py -c 'import sys, torch, triton; print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__, torch.cuda.get_device_name(0))'"
stage fla "${ATLAS_GPU_T_FLA:-240}" bash -c "$py -m atlas_cli fla certify --format json >'$out/fla_certify.json'; \
    rc=\$?; cat '$out/fla_certify.json'; exit \$rc"
stage tests "${ATLAS_GPU_T_TESTS:-240}" env -u TRITON_INTERPRET "$py" -m pytest tests/cuda_backend -q \
    -p no:cacheprovider -rfE --durations=15 --ignore=tests/cuda_backend/test_compile.py
stage kernels "${ATLAS_GPU_T_KERNELS:-240}" env -u TRITON_INTERPRET "$py" benchmarks/bench_kernels.py \
    --out "$out/kernels.json"
stage train "${ATLAS_GPU_T_TRAIN:-120}" env -u TRITON_INTERPRET "$py" -m atlas_cli train --device cuda \
    --out /tmp/atlas_gpu_run --no-progress
stage bench "${ATLAS_GPU_T_BENCH:-240}" env -u TRITON_INTERPRET "$py" -m atlas_cli bench --device cuda \
    --json "$out/bench.json" ${ATLAS_GPU_BENCH_ARGS:-}
stage compile "${ATLAS_GPU_T_COMPILE:-300}" env -u TRITON_INTERPRET "$py" -m pytest \
    tests/cuda_backend/test_compile.py -q -p no:cacheprovider -rfE
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: failed stages: ${failed[*]}"
    exit 1
fi
echo "gpu_check: every stage passed"
