#!/usr/bin/env bash
# Issue 16, engine speed on one H200: the GPU tests of the fused forward and the graphs, where a
# decode step's time goes (benchmarks/decode_step_profile.py), then `bench runtime` lines:
# llama-1b-shape batch 1 and batch 32 at context 512 (graphs against eager) with one 8k-token
# prefill in modelled TFLOP/s, and (BENCH_UNFUSED=1) the same through Transformer.forward.
# PARTS picks sections (default: "tests profile bench"); REPEATS runs each bench line in that many
# processes. Wheels the machine lacks travel in .whl/ (carry it). Log: $OUT/speed.log.
source "$(dirname "$0")/gpu_env.sh"
bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model llama-1b-shape --prompt-len 512"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  if [[ " $PARTS " == *" tests "* ]]; then
    echo "== GPU tests"
    timeout 100 python3 -m pytest -x -q -p no:cacheprovider tests/runtime/test_fused_forward.py \
      tests/runtime/test_cuda_graphs.py tests/runtime/test_moe_experts.py tests/runtime/test_batch_sampling.py \
      tests/runtime/test_triton_decode.py ${EXTRA_TESTS:-}
  fi
  if [[ " $PARTS " == *" profile "* ]]; then
    echo "== decode step profile"
    timeout 140 python3 benchmarks/decode_step_profile.py --batch 1 32 --modes ${PROFILE_MODES:-unfused fused} \
      --prefill-len ${PROFILE_PREFILL:-8192} --out "$OUT"
  fi
  if [[ " $PARTS " == *" bench "* ]]; then
    # Separate processes differ by up to ~10% (host noise): REPEATS runs of each line, fresh processes.
    for r in $(seq "${REPEATS:-1}"); do
      prefill=""; [[ "$r" == 1 ]] && prefill="--prefill-len 8192"
      echo "== llama-1b-shape batch 1, fused forward (run $r) $prefill"
      timeout 90 $bench --batch 1 --decode-steps 66 --compare-eager $prefill
      echo "== llama-1b-shape batch 32, context 512, fused forward (run $r)"
      timeout 60 $bench --batch 32 --decode-steps 66 --compare-eager
    done
    if [[ -n "${BENCH_UNFUSED:-}" ]]; then
      echo "== llama-1b-shape batch 1 and 32, Transformer.forward (before), + 8k prefill"
      timeout 60 $bench --batch 1 --decode-steps 66 --unfused --prefill-len 8192
      timeout 60 $bench --batch 32 --decode-steps 66 --unfused
    fi
    if [[ -n "${BENCH_MIXTRAL:-}" ]]; then
      echo "== mixtral-shape batch 16 (MoE graphs)"
      timeout 120 python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json --model mixtral-shape \
        --prompt-len 256 --batch 16 --decode-steps 16 --compare-eager
    fi
  fi
  date -u
} 2>&1 | tee "$OUT/speed.log"
