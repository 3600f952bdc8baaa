#!/usr/bin/env bash
# Everything measured on the GPU machine in one call (see BENCHMARKS.md for the results):
#   device run: bash benchmarks/run_gpu.sh   (wheels for missing packages carried in .whl/)
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
  echo "== correctness"; python3 benchmarks/gpu_check.py
  echo "== bench runtime"
  python3 -m infersight bench runtime --model tiny-moe --device cuda --dtype float32 --json
  python3 -m infersight bench runtime --model tiny-moe --device cuda --dtype bfloat16 --json
  python3 -m infersight bench runtime --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --prompt-len 512 --json
  python3 -m infersight bench runtime --model mixtral-shape --device cuda --dtype bfloat16 --batch 16 --prompt-len 256 --decode-steps 16 --json
  echo "== bench overhead"
  python3 -m infersight bench overhead --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --steps 150 --json
  python3 -m infersight bench overhead --model tiny-moe --device cuda --dtype bfloat16 --steps 200 --json
  echo "== bench ingest"; python3 -m infersight bench ingest --json
  echo "== profile capture"; python3 benchmarks/profile_capture.py "$OUT" --model tiny-moe
} 2>&1 | tee "$OUT/gpu_run.log"
