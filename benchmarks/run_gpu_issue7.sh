#!/usr/bin/env bash
# Issue 7's verification on the H200 in one device call (results in BENCHMARKS.md):
#   correctness of the Triton decode kernel; decode speed torch vs Triton; capture cost (one
#   process, rounds before and after a capture); ncu-measured DRAM bytes vs the roofline's model.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
M=llama-1b-shape
PART=${1:-all}   # main | ncu | all (main and ncu each fit one 10-minute device call)
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  if [ "$PART" != ncu ]; then
  echo "== correctness"; timeout 120 python3 benchmarks/gpu_check.py
  echo "== decode kernel: torch vs triton"
  for k in torch triton; do
    timeout 120 python3 -m infersight bench runtime --model $M --device cuda --dtype bfloat16 --batch 32 --prompt-len 512 --decode-attention $k --json
  done
  echo "== capture cost, torch.profiler"; timeout 180 python3 benchmarks/capture_check.py --model $M --tool torch
  echo "== capture cost, cudaProfilerStart/Stop"; timeout 120 python3 benchmarks/capture_check.py --model $M --tool cuda-profiler --before 2 --after 2
  fi
  if [ "$PART" != main ]; then
  echo "== what a torch.profiler window leaves behind (launch-bound loop, one process per line)"
  for v in none cpu cuda; do timeout 60 python3 benchmarks/profiler_residue.py --variant $v 2>&1 | grep -v Warning; done
  TEARDOWN_CUPTI=1 timeout 60 python3 benchmarks/profiler_residue.py --variant cuda 2>&1 | sed 's/^/TEARDOWN_CUPTI=1 /' | grep -v Warning
  TEARDOWN_CUPTI=0 timeout 60 python3 benchmarks/profiler_residue.py --variant cuda 2>&1 | sed 's/^/TEARDOWN_CUPTI=0 /' | grep -v Warning
  echo "== ncu: 20 captured steps, DRAM bytes of every GEMM and attention kernel in them"
  mkdir -p "$OUT/ncu"
  OUT="$OUT/ncu" timeout 420 ncu --clock-control none --profile-from-start off \
    --kernel-name regex:"nvjet|gemm|cutlass|xmma|paged_decode" \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --csv --page raw \
    --log-file "$OUT/ncu/ncu_window.csv" \
    python3 benchmarks/capture_check.py --model $M --tool cuda-profiler --before 0 --after 0 --capture-steps 20 \
    > "$OUT/ncu/app.log" 2>&1; echo "ncu rc=$?"; tail -5 "$OUT/ncu/app.log"
  python3 -m infersight analyze "$OUT/ncu/ncu_window.csv" --shapes "$OUT/ncu/capture_$M.shapes.json" | tail -40
  python3 -m infersight analyze "$OUT/ncu/ncu_window.csv" --shapes "$OUT/ncu/capture_$M.shapes.json" --format json > "$OUT/ncu/report.json"
  gzip -f "$OUT/ncu/ncu_window.csv"
  fi
} 2>&1 | tee "$OUT/gpu_issue7_$PART.log"
