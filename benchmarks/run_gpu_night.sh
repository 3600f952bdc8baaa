#!/usr/bin/env bash
# The night session's closing H200 call (issue 16): the GPU tests on the integrated tree, the
# observer's CPU time per batch-32 step against the session's starting tree (.before/, carried:
# `git archive <base> infersight benchmarks pyproject.toml | tar -x -C .before`), the probes' cost
# synchronous and async, and the decode steps with the Hugging Face anchor. Carry [".whl", ".before"].
# OBS_ROUNDS (default 3) rounds of the observer A/B. Log: $OUT/night.log.
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
llama="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512"
probe="python3 benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --context 512 --block-steps 16 --rounds 40 --rounds-per-life 8"
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  stamp "GPU tests"
  timeout 200 python3 -m pytest -rfE -p no:cacheprovider tests/runtime/test_async_scheduling.py \
    tests/runtime/test_cuda_graphs.py tests/runtime/test_fused_forward.py tests/runtime/test_batch_sampling.py \
    tests/runtime/test_profiled_decode.py tests/runtime/test_moe_experts.py tests/runtime/test_triton_decode.py \
    tests/runtime/test_tokens_told.py ${EXTRA_TESTS:-} 2>&1 | tail -n 4
  stamp "observer CPU time per batch-32 step, before / after / after again"
  timeout 150 taskset -c 5 python3 benchmarks/observer_cost.py --against .before --rounds "${OBS_ROUNDS:-3}" --steps 2000
  stamp "probe cost, synchronous"
  timeout 100 $probe > "$OUT/probe_sync.json"; tail -n 8 "$OUT/probe_sync.json" | head -n 7
  stamp "probe cost, async scheduling"
  timeout 100 $probe --async-scheduling > "$OUT/probe_async.json"; tail -n 8 "$OUT/probe_async.json" | head -n 7
  stamp "decode steps, async, with the HF anchor"
  timeout 100 $llama --batch 32 --decode-steps 130 --async-scheduling --hf-anchor eager
  timeout 150 $llama --batch 1 --decode-steps 130 --async-scheduling --hf-anchor all
  stamp "done"
} 2>&1 | tee "$OUT/night.log"
