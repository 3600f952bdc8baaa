#!/usr/bin/env bash
# Two trees for a same-call before/after on the GPU machine: .g2/before = the last commit,
# .g2/after = the last commit plus the kernel files named below (not other engineers' work in progress).
set -euo pipefail
grep -qx '/.g2/' .git/info/exclude 2>/dev/null || echo '/.g2/' >> .git/info/exclude
rm -rf .g2 && mkdir -p .g2/before .g2/after
git archive HEAD infersight benchmarks tests | tar -x -C .g2/before
git archive HEAD infersight benchmarks tests | tar -x -C .g2/after
for f in infersight/runtime/triton_decode.py infersight/runtime/attention.py infersight/runtime/moe.py \
         infersight/runtime/moe_experts.py infersight/runtime/layers.py infersight/runtime/model.py \
         benchmarks/decode_attention.py benchmarks/moe_decode.py benchmarks/forward_sync_check.py \
         benchmarks/observer_cost.py benchmarks/moe_engine_decode.py \
         tests/runtime/test_triton_decode.py tests/runtime/test_moe_experts.py; do
  cp "$f" ".g2/after/$f"
done
du -sh .g2
