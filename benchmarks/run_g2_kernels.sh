#!/usr/bin/env bash
# Issue 16, kernels: decode attention and MoE before/after in one GPU call.
#   here:   bash benchmarks/make_before_after.sh   (fills .g2/before = HEAD, .g2/after = HEAD + the new kernels)
#   device: bash benchmarks/run_g2_kernels.sh      (carry .g2)
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
B=$PWD/.g2/before
A=$PWD/.g2/after
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "grouped_mm", hasattr(torch, "_grouped_mm"))'
  echo "== GPU tests (after)"
  (cd "$A" && timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/test_triton_decode.py tests/runtime/test_moe_experts.py)
  echo "== decode forward: no host sync, CUDA graph replay == eager"
  (cd "$A" && timeout 120 python3 benchmarks/forward_sync_check.py)
  echo "== observer CPU time per step, batch 32 (this machine's CPU), before then after"
  (cd "$B" && cp "$A/benchmarks/observer_cost.py" /tmp/observer_cost_before.py && cd "$B" && PYTHONPATH="$B" timeout 60 python3 -c 'import runpy, sys; sys.argv = ["observer_cost"]; sys.path.insert(0, "."); runpy.run_path("/tmp/observer_cost_before.py", run_name="__main__")')
  timeout 60 python3 benchmarks/observer_cost.py
  echo "== decode attention, before vs after, sweep"
  (cd "$A" && timeout 240 python3 benchmarks/decode_attention.py --before "$B/infersight/runtime/triton_decode.py" --sweep)
  echo "== MoE layer, mixtral shape"
  (cd "$A" && timeout 90 python3 benchmarks/moe_decode.py --batch 16 && timeout 60 python3 benchmarks/moe_decode.py --batch 1 --repeats 20 \
     && timeout 60 python3 benchmarks/moe_decode.py --batch 4 --repeats 20)
  echo "== mixtral-shape engine decode batch 16, before then after"
  for tree in "$B" "$A"; do
    (cd "$tree" && timeout 150 python3 -c 'import json, sys; from infersight.bench.runtime import bench_runtime, as_dict
r = bench_runtime(model="mixtral-shape", device="cuda", dtype="bfloat16", batch=16, prompt_len=256, decode_steps=16)
print(sys.argv[1], json.dumps(as_dict(r)))' "$(basename "$tree")")
  done
  echo "== ncu, decode kernels"
  (cd "$A" && timeout 120 ncu --clock-control none --kernel-name regex:_paged_decode --launch-count 60 \
     --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
     python3 benchmarks/decode_attention.py --ncu --before "$B/infersight/runtime/triton_decode.py" > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err"; echo "ncu rc=$?")
  grep -c _paged_decode "$OUT/ncu_decode.csv"
} 2>&1 | tee "$OUT/g2_run.log"
