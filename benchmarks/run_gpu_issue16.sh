#!/usr/bin/env bash
# Issue 16, integrated check on one H200: the GPU tests of graphs / sampling / MoE / the decode kernel,
# then decode steps of the whole engine (graphs against eager in one process) for llama-1b-shape at
# batch 1 and 32 and mixtral-shape at batch 16. Wheels the machine lacks travel in .whl/ (carry it).
source "$(dirname "$0")/gpu_env.sh"
bench="python3 -m infersight bench runtime --device cuda --dtype bfloat16 --json"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
  echo "== GPU tests"
  timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/runtime/test_cuda_graphs.py \
    tests/runtime/test_moe_experts.py tests/runtime/test_batch_sampling.py tests/runtime/test_triton_decode.py
  echo "== llama-1b-shape batch 1"
  timeout 60 $bench --model llama-1b-shape --prompt-len 512 --batch 1 --decode-steps 66 --compare-eager
  echo "== llama-1b-shape batch 32, context 512"
  timeout 60 $bench --model llama-1b-shape --prompt-len 512 --batch 32 --decode-steps 66 --compare-eager
  echo "== mixtral-shape batch 16"
  timeout 90 $bench --model mixtral-shape --prompt-len 256 --batch 16 --decode-steps 16 --compare-eager
  echo "== llama-1b-shape batch 32, context 512, compile_layers"
  timeout 90 $bench --model llama-1b-shape --prompt-len 512 --batch 32 --decode-steps 34 --compare-eager --compile-layers
} 2>&1 | tee "$OUT/issue16.log"
