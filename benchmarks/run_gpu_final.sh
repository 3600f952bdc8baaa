#!/usr/bin/env bash
# One H200 call that re-measures, on the integrated tree, what the evening session's goals need:
# the GPU tests, the agent's ingest and the observer's CPU time on the GPU host's quiet cores
# against the session's starting tree (.before/, carried: `git archive 57fadf9 infersight benchmarks
# pyproject.toml | tar -x -C .before`), the probe cost and one recorder window's cost on the fast
# engine, and the decode steps. Carry [".whl", ".before"]. Log: $OUT/final.log.
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512"
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  stamp "GPU tests"
  timeout 140 python3 -m pytest -q -p no:cacheprovider tests/runtime/test_profiled_decode.py \
    tests/runtime/test_fused_forward.py tests/runtime/test_cuda_graphs.py tests/runtime/test_moe_experts.py \
    tests/runtime/test_batch_sampling.py tests/runtime/test_triton_decode.py ${EXTRA_TESTS:-}
  if [[ -d .before ]]; then
    stamp "agent ingest, one poll per fresh process on one core, before / after / after again"
    timeout 100 python3 benchmarks/ingest_ab.py --against .before --pairs 4 --core 3
    stamp "observer CPU time per batch-32 step, before / after / after again"
    timeout 60 taskset -c 5 python3 benchmarks/observer_cost.py --against .before --rounds 3 --steps 2000
  fi
  stamp "probe cost on the fast engine"
  timeout 100 python3 benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
    --context 512 --block-steps 16 --rounds 64 --rounds-per-life 8 > "$OUT/probe_cost.json"
  stamp "one recorder window's cost by blocks against the recorder's own measure"
  timeout 120 python3 benchmarks/window_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
    --context 512 --windows 16 --block-steps 64 > "$OUT/window_cost.json"
  stamp "decode steps"
  timeout 60 $bench --batch 32 --decode-steps 66 --compare-eager
  timeout 60 $bench --batch 1 --decode-steps 66 --compare-eager
  stamp "done"
} 2>&1 | tee "$OUT/final.log"
