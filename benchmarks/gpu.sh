#!/usr/bin/env bash
# One H200 call per suite, named by what it checks: `bash benchmarks/gpu.sh SUITE [SUITE ...]`
# (device tool, carry [".whl"]). Each suite logs to $OUT/SUITE.log and leaves its JSON under $OUT.
#
#   speculation   the CUDA-graph tests; `bench speculation` on CUDA (measured A/B, batch 4 and 16)
#                 against the demo's predictions on CUDA; meanwhile, on CPU cores 8-15, the
#                 calibration runs of spec_speedup.MODEL_ERROR (benchmarks/spec_calibration.py)
#   ceilings      `bench ceilings` on CUDA (bf16, then float32), then `analyze` naming the ceiling
#   speculation_check  `bench speculation` on CUDA at another seed: the CUDA model error checked
#   energy        benchmarks/energy_split_check.py: request classes alone, then mixed (NVML energy),
#                 the counter read every 1 s and every 0.1 s
source "$(dirname "$0")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

speculation() {
  local bench="python3 -m infersight bench speculation --device cuda --json --rounds 3"
  taskset -c 8-15 python3 benchmarks/spec_calibration.py --seeds 101-108 --batches 4 8 --workers 8 --first-core 8 \
    --out "$OUT/spec_calibration_cpu.jsonl" > "$OUT/spec_calibration_cpu.txt" 2>&1 &
  local calib=$!
  stamp "CUDA-graph tests"
  timeout 240 taskset -c 0-7 python3 -m pytest -q -p no:cacheprovider -x tests/runtime/test_cuda_graphs.py
  for b in 4 16; do
    stamp "bench speculation batch $b"
    timeout 240 taskset -c 0-7 $bench --batch $b --requests $((8 * b)) > "$OUT/spec_bench_b$b.json"
    tail -n 1 "$OUT/spec_bench_b$b.json"
  done
  stamp "demo on CUDA"
  timeout 300 taskset -c 0-7 python3 -m infersight demo --device cuda --out "$OUT/demo" > "$OUT/demo.txt" 2>&1
  tail -n 40 "$OUT/demo.txt"
  python3 - "$OUT/demo/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("TTFT p50", s["ttft_seconds"]["p50"], "p99", s["ttft_seconds"]["p99"])
for t, v in sorted(s["spec"]["by_task"].items()):
    print(t, v["predicted_speedup"], v["speedup_interval"], v["basis"], v["samples"], v["parts_ms"])
EOF
  stamp "waiting for the CPU calibration"
  wait $calib
  tail -n 3 "$OUT/spec_calibration_cpu.txt"
  stamp "done"
}

ceilings() {
  export INFERSIGHT_CEILINGS="$OUT/ceilings.json"
  stamp "bench ceilings"
  timeout 120 python3 -m infersight bench ceilings --device cuda --dtype bfloat16 --json | tee "$OUT/ceilings_bf16.json"
  timeout 120 python3 -m infersight bench ceilings --device cuda --dtype float32 --json | tee "$OUT/ceilings_f32.json"
  stamp "analyze against the measured ceilings"
  python3 -m infersight analyze tests/kernels/data/kineto_llama-1b-decode-graphs-h200.json.gz | sed -n '/^roofline/,/^findings/p'
  stamp "bench runtime: roofline share against the measured copy bandwidth"
  timeout 300 python3 -m infersight bench runtime --model llama-1b-shape --device cuda --dtype bfloat16 --batch 1 \
    --prompt-len 512 --prefill-len 8192 --json | tee "$OUT/runtime_ceiling.json"
}

energy() {
  stamp "energy split, NVML every 1 s"
  timeout 400 python3 benchmarks/energy_split_check.py --device cuda --out "$OUT/energy_split.json"
  stamp "energy split, NVML every 0.1 s"
  timeout 400 python3 benchmarks/energy_split_check.py --device cuda --interval-s 0.1 --out "$OUT/energy_split_0.1.json"
}

speculation_check() {
  stamp "bench speculation on CUDA, seed 1 (not the calibration's), batch 16"
  timeout 300 python3 -m infersight bench speculation --device cuda --json --rounds 3 --batch 16 --requests 128 \
    --seed 1 > "$OUT/spec_bench_seed1_b16.json"
  tail -n 1 "$OUT/spec_bench_seed1_b16.json"
}

for suite in "$@"; do
  case "$suite" in
    speculation|speculation_check|ceilings|energy) "$suite" 2>&1 | tee "$OUT/$suite.log" ;;
    *) echo "unknown suite: $suite (speculation, speculation_check, ceilings, energy)"; exit 2 ;;
  esac
done
