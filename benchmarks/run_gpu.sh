#!/usr/bin/env bash
# Everything measured on the GPU machine in one call (results in BENCHMARKS.md):
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
  echo "== bench overhead (one engine, probes switched per step)"
  python3 -m infersight bench overhead --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --steps 100 --json
  python3 -m infersight bench overhead --model tiny-moe --device cuda --dtype bfloat16 --steps 150 --json
  echo "== capture through the agent API"; python3 benchmarks/capture_check.py --model llama-1b-shape
  echo "== GPU telemetry phases"; python3 benchmarks/gpu_telemetry_check.py
  echo "== GPM vs ncu (same kernels)"
  timeout 150 ncu --clock-control none --nvtx --nvtx-include "gemm/" --nvtx-include "copy/" \
    --metrics sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --csv python3 benchmarks/gpu_telemetry_check.py --ncu > "$OUT/ncu_telemetry.csv" 2>"$OUT/ncu_telemetry.err"; echo "ncu rc=$?"
  grep -E '"(sm|dram)__throughput' "$OUT/ncu_telemetry.csv" | head -12
  echo "== bench runtime"
  python3 -m infersight bench runtime --model tiny-moe --device cuda --dtype bfloat16 --json
  python3 -m infersight bench runtime --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --prompt-len 512 --json
  python3 -m infersight bench runtime --model mixtral-shape --device cuda --dtype bfloat16 --batch 16 --prompt-len 256 --decode-steps 16 --json
} 2>&1 | tee "$OUT/gpu_run.log"
