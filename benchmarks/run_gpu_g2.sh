#!/usr/bin/env bash
# Issues 16/18 (G2), one H200: decode graphs under the profiler, tiny-moe graphs, host time per step.
#   tests:   the GPU tests (kernel-activity window replays graphs with eager's tokens; full capture eager;
#            tiny-moe graphs float32 + bf16 with exact expert counts; grouped GEMM only where it does not sync)
#   capture: benchmarks/capture_check.py, a kernel-activity window (graphs) and a full capture (eager)
#   bench:   `bench runtime` llama-1b-shape batch 32 context 512, REPEATS processes (default 3)
#   host:    benchmarks/host_step.py on this host's CPU (the engine's host work, the GPU stubbed out)
#   demo:    `infersight demo --device cuda` log lines about CUDA graphs (tiny-moe float32)
# PARTS picks sections (default: all). Carry [".whl"]. Log: $OUT/g2.log.
source "$(dirname "$0")/gpu_env.sh"
PARTS=${PARTS:-tests capture bench host}
bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  if [[ " $PARTS " == *" tests "* ]]; then
    echo "== GPU tests"
    timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/runtime/test_profiled_decode.py \
      tests/runtime/test_cuda_graphs.py tests/runtime/test_moe_experts.py tests/runtime/test_fused_forward.py
  fi
  if [[ " $PARTS " == *" capture "* ]]; then
    for tool in torch-kernels torch; do
      echo "== capture_check --tool $tool"
      timeout 120 python3 benchmarks/capture_check.py --tool "$tool" --tokens 128 --before 4 --after 4 \
        --capture-at 20 2>&1 | tail -25
    done
  fi
  if [[ " $PARTS " == *" bench "* ]]; then
    for r in $(seq "${REPEATS:-3}"); do
      echo "== llama-1b-shape batch 32, context 512 (run $r)"
      timeout 60 $bench --batch 32 --decode-steps 66 --compare-eager
    done
  fi
  if [[ " $PARTS " == *" host "* ]]; then
    echo "== host_step (engine host work per batch-32 decode step, GPU stubbed), 3 processes"
    for r in 1 2 3; do timeout 60 taskset -c 1 python3 benchmarks/host_step.py --steps 400; done
  fi
  if [[ " $PARTS " == *" demo "* ]]; then
    echo "== demo --device cuda (graph lines)"
    timeout 150 python3 -m infersight demo --device cuda --requests 48 --out "$OUT/demo" 2>&1 | grep -i -E "graph|ttft" | head -20
  fi
  date -u
} 2>&1 | tee "$OUT/g2.log"
