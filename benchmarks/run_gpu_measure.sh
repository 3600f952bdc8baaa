#!/usr/bin/env bash
# Issues 16 + 18 on one H200, on the fast engine (CUDA graphs on, llama-1b-shape, bf16), one call:
#   probe   probe cost (benchmarks/probe_cost.py: interleaved blocks, A/A noise floor, callbacks timed in place)
#   capture step time after a capture + the agent's diagnosis (benchmarks/capture_check.py; eager inside the
#           window as the engine runs it, and --replay-graphs: the graphs replayed inside it)
#   demo    demo TTFT on CUDA: where the time goes (benchmarks/demo_ttft.py) and `infersight demo --device cuda`
#   wincost one window's cost by blocks vs the recorder's measure (benchmarks/window_cost.py; not in the default)
#   fr      the flight recorder's amortised cost and category shares (benchmarks/flight_recorder_quick.py)
# Usage: bash benchmarks/run_gpu_measure.sh [PARTS] [FR_ROUNDS] [FR_BLOCK_S]  (PARTS: comma list, default all;
# carry .whl). Logs: $OUT/measure.log and one JSON per part.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PARTS=${1:-probe,capture,demo,fr}
FR_ROUNDS=${2:-3}
FR_BLOCK_S=${3:-8}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
want() { [[ ",$PARTS," == *",$1,"* ]]; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
  if want probe; then
    stamp "probe cost"
    timeout 100 python3 benchmarks/probe_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
      --context 512 --block-steps 16 --rounds 64 --rounds-per-life 8 > "$OUT/probe_cost.json"
  fi
  if want capture; then
    stamp "capture check, graphs replayed inside the capture"
    timeout 110 python3 benchmarks/capture_check.py --tool torch --tokens 128 --before 4 --after 4 --capture-at 20 \
      --replay-graphs
  fi
  if want demo; then
    stamp "demo TTFT variants"
    timeout 120 python3 benchmarks/demo_ttft.py --device cuda --variants cold,warmed,nospec > "$OUT/demo_ttft.json"
    stamp "infersight demo --device cuda"
    timeout 75 python3 -m infersight demo --device cuda --out /tmp/demo-out 2>&1 | grep -v "^\s*$" | head -40
  fi
  if want wincost; then
    stamp "one window's cost, A/B by blocks against the recorder's own measure"
    timeout 120 python3 benchmarks/window_cost.py --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 \
      --context 512 --windows 16 --block-steps 64 > "$OUT/window_cost.json"
  fi
  if want fr; then
    stamp "flight recorder (quick)"
    timeout 240 python3 benchmarks/flight_recorder_quick.py --model llama-1b-shape --device cuda --dtype bfloat16 \
      --batch 32 --context 512 --block-s "$FR_BLOCK_S" --rounds "$FR_ROUNDS" --long-steps 60 > "$OUT/fr_quick.json"
  fi
  stamp "done"
} 2>&1 | tee "$OUT/measure.log"
