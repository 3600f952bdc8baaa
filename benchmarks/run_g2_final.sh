#!/usr/bin/env bash
# Issue 16, kernels, confirmation call: decode attention before/after (+ncu) and mixtral-shape engine
# decode before/after with the MoE paths interleaved. Trees from benchmarks/make_before_after.sh (carry .g2).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
B=$PWD/.g2/before
A=$PWD/.g2/after
{
  echo "== decode attention, before vs after"
  (cd "$A" && timeout 150 python3 benchmarks/decode_attention.py --before "$B/infersight/runtime/triton_decode.py")
  echo "== ncu, decode kernels"
  (cd "$A" && timeout 120 ncu --clock-control none --kernel-name regex:_paged_decode --launch-count 60 \
     --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
     python3 benchmarks/decode_attention.py --ncu --before "$B/infersight/runtime/triton_decode.py" > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"; echo "ncu rc=$?")
  echo "== mixtral-shape engine decode batch 16: before, then after with paths interleaved"
  (cd "$B" && PYTHONPATH="$B" timeout 150 python3 "$A/benchmarks/moe_engine_decode.py" --paths auto --rounds 3 --steps 8)
  (cd "$A" && PYTHONPATH="$A" timeout 200 python3 benchmarks/moe_engine_decode.py --paths auto,grouped,padded,loop --rounds 3 --steps 8)
} 2>&1 | tee "$OUT/g2_final.log"
