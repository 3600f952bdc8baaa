#!/usr/bin/env bash
# One H200 call for the batch-1 matrix-vector kernels (issue 16): the GPU tests, the projections
# against cuBLAS, then batch-1 decode with and without them (sync and async, alternating processes).
# Carry [".whl"]. Log: $OUT/gemv.log.
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
llama="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512 --decode-steps 130"
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  stamp "GPU tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_fused_forward.py \
    tests/runtime/test_async_scheduling.py tests/runtime/test_cuda_graphs.py tests/runtime/test_engine_equivalence.py
  stamp "projections: cuBLAS against runtime.triton_gemv"
  timeout 60 python3 benchmarks/gemv_bench.py | grep -v '^\['
  for round in 1 2; do
    for mode in "--no-gemv" "" "--no-gemv --async-scheduling" "--async-scheduling"; do
      stamp "batch 1 ${mode:-gemv} (round $round)"
      timeout 60 $llama --batch 1 $mode
    done
  done
  stamp "batch 32 async (gemv not used at 32 tokens)"
  timeout 60 $llama --batch 32 --async-scheduling
  stamp "done"
} 2>&1 | tee "$OUT/gemv.log"
