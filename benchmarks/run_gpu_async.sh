#!/usr/bin/env bash
# One H200 call for async scheduling (issue 16): the GPU tests, then decode steps synchronous and
# async in alternating processes (batch 32 at context 512, batch 1), the probes' cost with async
# scheduling, and mixtral-shape batch 16 on the fused path. Carry [".whl"]. Log: $OUT/async.log.
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json"
llama="$bench --model llama-1b-shape --prompt-len 512 --decode-steps 130"
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  stamp "GPU tests"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/runtime/test_async_scheduling.py \
    tests/runtime/test_cuda_graphs.py tests/runtime/test_fused_forward.py tests/runtime/test_batch_sampling.py \
    tests/runtime/test_profiled_decode.py ${EXTRA_TESTS:-}
  for round in 1 2; do
    for mode in "" "--async-scheduling"; do
      stamp "batch 32 context 512 ${mode:-sync} (round $round)"
      timeout 60 $llama --batch 32 $mode
      stamp "batch 1 ${mode:-sync} (round $round)"
      timeout 60 $llama --batch 1 $mode
    done
  done
  stamp "probe cost, async scheduling"
  timeout 110 python3 benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
    --context 512 --block-steps 16 --rounds 48 --rounds-per-life 8 --async-scheduling > "$OUT/probe_cost_async.json"
  tail -n 12 "$OUT/probe_cost_async.json" | head -n 11
  stamp "mixtral-shape batch 16, fused path, sync then async"
  timeout 80 $bench --model mixtral-shape --prompt-len 256 --batch 16 --decode-steps 34
  timeout 80 $bench --model mixtral-shape --prompt-len 256 --batch 16 --decode-steps 34 --async-scheduling
  stamp "done"
} 2>&1 | tee "$OUT/async.log"
