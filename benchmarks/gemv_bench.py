"""The decode projections of llama-1b-shape at 1-4 tokens: cuBLAS (F.linear) against
runtime.model.triton_gemv, each timed as a CUDA graph of many calls over distinct weights (more bytes
than L2), median of replays; GB/s and % of the copy bandwidth. Checks the results too.

    python benchmarks/gemv_bench.py [--tokens 1 2 4] [--copy-gbps 4270]
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from infersight.bench.engine.timing import captured, replay_ms
from infersight.runtime.model.triton_fused import silu_mul
from infersight.runtime.model.triton_gemv import _launch, gemv, gemv_silu_mul

SHAPES = {"qkv": (3072, 2048), "out": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}


def timed(fn, reps: int = 30) -> float:
    return replay_ms(captured(fn), reps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1])
    p.add_argument("--copy-gbps", type=float, default=4270.0)
    p.add_argument("--sweep", action="store_true", help="also time every (BLOCK_N, BLOCK_K, warps) of a small grid")
    args = p.parse_args()
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(4, int(400e6 // (n * k * 2)))  # 400 MB of weights: far past L2
        ws = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
        for t in args.tokens:
            x = torch.randn(t, k, dtype=torch.bfloat16, device="cuda")
            nbytes = copies * n * k * 2
            if name == "gate_up":
                ref = silu_mul(F.linear(x, ws[0]))
                got = gemv_silu_mul(x, ws[0])
                variants = {"cublas+silu_mul": lambda: [silu_mul(F.linear(x, w)) for w in ws],
                            "gemv_silu_mul": lambda: [gemv_silu_mul(x, w) for w in ws],
                            "gemv+silu_mul": lambda: [silu_mul(gemv(x, w)) for w in ws]}
            else:
                ref, got = F.linear(x, ws[0]), gemv(x, ws[0])
                variants = {"cublas": lambda: [F.linear(x, w) for w in ws], "gemv": lambda: [gemv(x, w) for w in ws]}
            err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
            if args.sweep:
                gated = name == "gate_up"
                out_n = n // 2 if gated else n
                grid = ((16, 32, 64), (128, 256), (4, 8)) if gated else ((1, 2, 4, 8), (1024, 2048), (4, 8, 16))
                for bn in grid[0]:
                    for bk in grid[1]:
                        for nw in grid[2]:
                            variants[f"sweep {bn}/{bk}/{nw}"] = (
                                lambda bn=bn, bk=bk, nw=nw: [_launch(x, w, None, out_n, gated, bn, bk, nw) for w in ws])
            for v, fn in variants.items():
                ms = timed(fn)
                gbps = nbytes / (ms / 1e3) / 1e9
                rows.append({"shape": name, "n": n, "k": k, "tokens": t, "variant": v,
                             "us_per_call": round(ms * 1e3 / copies, 2), "gbps": round(gbps),
                             "pct_copy": round(100 * gbps / args.copy_gbps, 1), "rel_err": round(err, 5)})
                print(f"{name:8s} t={t} {v:16s} {rows[-1]['us_per_call']:8.2f} us  {rows[-1]['gbps']:5d} GB/s "
                      f"{rows[-1]['pct_copy']:5.1f}%  err {err:.1e}")
        ws.clear()
        torch.cuda.empty_cache()
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
