"""What one prefill-segment attention call costs on the host and on the device, per SDPA backend,
when every call has a new (queries, context) shape — as chunked prefill in a serving loop does —
against the same shape repeated. Finds per-shape set-up costs (plan building) that a benchmark with
fixed shapes never sees.

    python3 benchmarks/sdpa_shapes.py --device cuda [--heads 32 --kv-heads 8 --head-dim 64]
Prints one JSON line per (backend, shapes) with host ms per call (the Python call's wall time) and
device ms per call (CUDA events), both measured, medians over the calls.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def one_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int) -> torch.Tensor:
    lq, lk = q.shape[2], k.shape[2]
    if lq == lk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(diagonal=q_offset)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def shapes(n: int, fixed: bool, seed: int) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    if fixed:
        return [(256, 768)] * n
    out = []
    for _ in range(n):
        lq = rnd.randint(16, 512)
        out.append((lq, lq + rnd.choice([0, rnd.randint(1, 1024)])))
    return out


def run(backend: str, fixed: bool, args: argparse.Namespace) -> dict:
    dev, dt = torch.device(args.device), torch.bfloat16
    backends = {"default": None, "efficient": [SDPBackend.EFFICIENT_ATTENTION],
                "cudnn": [SDPBackend.CUDNN_ATTENTION], "math": [SDPBackend.MATH],
                "flash_efficient": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]}[backend]
    host, device = [], []
    for lq, lk in shapes(args.calls, fixed, args.seed):
        q = torch.randn(1, args.heads, lq, args.head_dim, device=dev, dtype=dt)
        k = torch.randn(1, args.heads, lk, args.head_dim, device=dev, dtype=dt)
        v = torch.randn_like(k)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        if backends is None:
            one_call(q, k, v, lk - lq)
        else:
            with sdpa_kernel(backends):
                one_call(q, k, v, lk - lq)
        b.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        device.append(a.elapsed_time(b))
    skip = args.calls // 5  # the first calls pay the library's one-time set-up
    return {"backend": backend, "shapes": "fixed" if fixed else "new each call", "calls": args.calls - skip,
            "host_ms_median": round(statistics.median(host[skip:]), 4),
            "host_ms_p90": round(sorted(host[skip:])[int(0.9 * (len(host) - skip))], 4),
            "device_ms_median": round(statistics.median(device[skip:]), 4), "measured": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}))
    for backend in ("default", "efficient", "cudnn", "flash_efficient", "math"):
        for fixed in (True, False):
            try:
                print(json.dumps(run(backend, fixed, args)), flush=True)
            except RuntimeError as exc:
                print(json.dumps({"backend": backend, "fixed": fixed, "error": str(exc).splitlines()[0][:200]}))


if __name__ == "__main__":
    main()
