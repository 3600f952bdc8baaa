#!/usr/bin/env bash
# Issue 19: expert parallelism at W = 4 and W = 8, one rank per H200 of one host, NCCL, with NVLink
# multicast off in every rank (the three variables below; ep_bench.py sets them again before NCCL).
#
#   bash benchmarks/run_gpu_ep.sh x4    # on nvidia-h200-x4: W = 4
#   bash benchmarks/run_gpu_ep.sh x8    # on nvidia-h200-x8: W = 8
#   bash benchmarks/run_gpu_ep.sh cpu   # gloo, W = 4 CPU processes, tiny-moe: checks the script runs
#
# Each ep_bench run writes $OUT/ep_w<W>_<model>_<layers>l.json (all-to-all share of MoE time, bytes
# per peer, straggler rank per step, replication plan predicted against measured balance, parameter
# bytes and peak memory per rank); the console goes to $OUT/ep_<mode>.log. The 8-layer runs use the
# flags of the W = 2 run (2 x H200, 2026-11-29; BENCHMARKS.md of commit aa59687), so they compare; the
# 32-layer run fits since each rank builds only its experts (25 GB a rank at W = 4, 14 GB at W = 8,
# before replicas).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH=$PWD
PY=${PY:-python3}
mode=${1:-}
if [ "$mode" = x4 ] || [ "$mode" = x8 ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then  # the GPU image lacks a few wheels (BRIEF: carry .whl)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
  fi
fi
bench_flags="--model mixtral-shape --dtype bfloat16 --batch 64 --prompt-len 128 --warmup 4 --steps 32 --out $OUT"

gpu_run() {  # gpu_run W LAYERS TIMEOUT_S
  echo "== W=$1 mixtral-shape layers=$2 (0: all 32)"
  timeout "$3" $PY -m torch.distributed.run --standalone --nproc-per-node "$1" \
    benchmarks/ep_bench.py $bench_flags --layers "$2"
  echo "rc=$?"
}

case "$mode" in
  x4|x8)
    {
      nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
      nvidia-smi topo -m
      $PY -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
      env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
      # timeouts sum below the device tool's 600 s a call; the 8-layer report is written first
      if [ "$mode" = x4 ]; then
        gpu_run 4 8 250
        gpu_run 4 0 300
      else
        gpu_run 8 8 250
        gpu_run 8 0 300
      fi
    } 2>&1 | tee "$OUT/ep_$mode.log"
    ;;
  cpu)
    port=$($PY -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    {
      echo "== W=4 gloo tiny-moe"
      timeout 300 $PY -m torch.distributed.run --nnodes 1 --nproc-per-node 4 --master-addr 127.0.0.1 \
        --master-port "$port" benchmarks/ep_bench.py --device cpu --model tiny-moe --layers 0 --dtype float32 \
        --batch 8 --prompt-len 16 --warmup 2 --steps 12 --out "$OUT"
      echo "rc=$?"
    } 2>&1 | tee "$OUT/ep_cpu.log"
    ;;
  *)
    echo "usage: bash benchmarks/run_gpu_ep.sh x4|x8|cpu" >&2
    exit 2
    ;;
esac
