#!/usr/bin/env bash
# Why do steps stay slower after a torch.profiler capture? The same A/B three ways (see BENCHMARKS.md).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-out}
{
echo "== torch profiler, default"; python3 benchmarks/capture_check.py --steps 40 2>&1 | grep -E "median|state="
echo "== torch profiler, TEARDOWN_CUPTI=1"; TEARDOWN_CUPTI=1 python3 benchmarks/capture_check.py --steps 40 2>&1 | grep -E "median|state="
echo "== cudaProfilerStart/Stop (no profiler attached)"; python3 benchmarks/capture_check.py --steps 40 --tool cuda-profiler 2>&1 | grep -E "median|state="
} 2>&1 | tee "$OUT/capture_cost.log"
