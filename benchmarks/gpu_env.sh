# Sourced by benchmarks/gpu.sh on the GPU machine: $OUT for the logs, unbuffered
# Python, and the wheels the machine lacks (carried in .whl/) installed under /tmp/site.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # the GPU machine only
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
