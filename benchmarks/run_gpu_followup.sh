set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
python3 -m infersight bench overhead --model tiny-moe --device cuda --dtype bfloat16 --steps 150 --json
python3 -m infersight bench overhead --model llama-1b-shape --device cuda --dtype bfloat16 --batch 32 --steps 150 --json
python3 benchmarks/capture_check.py --model llama-1b-shape
} 2>&1 | tee $OUT/gpu_run3.log
