"""Paged decode attention on the GPU: bytes/s of the Triton kernel on its own bytes, and a sweep.

    python3 benchmarks/decode_attention.py [--before PATH_TO_OLD_triton_decode.py] [--sweep] [--ncu]

Bytes per call = the K and V rows of every context token (read) + q (read) + out (written); the
split partials are the kernel's own overhead and are not counted. Each shape gets enough layers'
caches (pages shuffled, as in a pool) to be several times the L2, and one timed unit is a CUDA
graph of one call per layer, so launch gaps and L2 hits do not flatter the number. Median of many
replays, CUDA events. --before times an older version of the module (a file) in the same process.
--ncu: a few plain launches per shape, for `ncu --kernel-name regex:_paged_decode`.
Prints a short table last; writes everything as JSON to $OUT/decode_attention.json.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
from dataclasses import asdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings  # noqa: E402
from infersight.runtime.model.attention import paged_decode_attention  # noqa: E402
from infersight.runtime.model.triton_decode import DecodeTuning, triton_paged_decode_attention  # noqa: E402

#: The %copy columns' ceiling: this GPU's copy bandwidth (bytes read + written) as `infersight bench
#: ceilings` measured and cached it, else its datasheet's; the table names which.
CEILING = (lookup_ceilings(torch.cuda.get_device_name(), "bfloat16", given_as=None)
           if torch.cuda.is_available() else None)
COPY_BW = CEILING.ceilings.peak_gbps * 1e9 if CEILING is not None and CEILING.ceilings else float("nan")
# (name, batch, context, kv heads, query heads per kv head, head dim)
SHAPES = [("llama-1b b32 ctx512", 32, 512, 8, 4, 64), ("llama-1b b1 ctx4096", 1, 4096, 8, 4, 64),
          ("llama-1b b32 ctx4096", 32, 4096, 8, 4, 64), ("mixtral b16 ctx512", 16, 512, 8, 4, 128),
          ("mixtral b16 ctx4096", 16, 4096, 8, 4, 128), ("mixtral b64 ctx2048", 64, 2048, 8, 4, 128)]
PAGE = 16
MIN_BYTES = 400e6  # per shape, across layers: several times the 50 MB L2


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("decode_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_case(batch: int, ctx: int, hkv: int, group: int, dim: int, gen: torch.Generator) -> dict:
    per_layer = batch * ctx * hkv * dim * 2 * 2
    layers = max(2, min(64, math.ceil(MIN_BYTES / per_layer)))
    pages = batch * -(-ctx // PAGE)
    shape = (layers, pages + 1, PAGE, hkv, dim)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    tables = (torch.randperm(pages, device="cuda", generator=gen) + 1).view(batch, -1)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.long)
    q = torch.randn(batch, hkv * group, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    kv_bytes = batch * ctx * hkv * dim * 2 * 2
    return dict(k=k, v=v, tables=tables, lens=lens, q=q, layers=layers,
                bytes=kv_bytes + 2 * q.numel() * q.element_size())


def time_graph(fn, case: dict, replays: int = 40) -> float:
    """Median seconds per call: a CUDA graph of one call per layer, replayed."""
    layers = case["layers"]
    calls = [lambda i=i: fn(case["q"], case["k"][i], case["v"][i], case["tables"], case["lens"]) for i in range(layers)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:  # warm-up: compile, allocate
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / layers)
    return statistics.median(times)


def check(fn, case: dict) -> float:
    """Relative error against the torch reference (float32 math) on layer 0."""
    args = (case["q"], case["k"][0], case["v"][0], case["tables"], case["lens"])
    want = paged_decode_attention(*(a.float() if a.is_floating_point() else a for a in args))
    got = fn(*args).float()
    return float((got - want).abs().max() / want.abs().max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="path of an older triton_decode.py to time in the same process")
    ap.add_argument("--sweep", action="store_true", help="also sweep the launch parameters")
    ap.add_argument("--ncu", action="store_true", help="a few plain launches per shape, for ncu")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    kernels = {"after": triton_paged_decode_attention}
    if args.before:
        kernels = {"before": load_module(args.before).triton_paged_decode_attention, **kernels}
    if args.ncu:
        for name, *shape in SHAPES[:4]:
            case = make_case(*shape, gen)
            for label, fn in kernels.items():
                for i in range(3):
                    fn(case["q"], case["k"][i % case["layers"]], case["v"][i % case["layers"]],
                       case["tables"], case["lens"])
            torch.cuda.synchronize()
            print("ncu launches done:", name, "bytes/call", case["bytes"])
            del case
        return 0
    rows, sweep = [], []
    for name, *shape in SHAPES:
        case = make_case(*shape, gen)
        row = {"shape": name, "bytes": case["bytes"], "layers": case["layers"]}
        for label, fn in kernels.items():
            row[f"{label}_rel_err"] = check(fn, case)
            sec = time_graph(fn, case)
            row[f"{label}_us"] = sec * 1e6
            row[f"{label}_GBps"] = case["bytes"] / sec / 1e9
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.sweep and name in (SHAPES[0][0], SHAPES[3][0], SHAPES[4][0], SHAPES[1][0]):
            for bt in (32, 64, 128):
                for nw in (2, 4):
                    for ns in (2, 3):
                        for tp in (1024, 2048, 4096):
                            tune = DecodeTuning(block_t=bt, num_warps=nw, num_stages=ns, target_programs=tp)
                            fn = lambda *a, t=tune: triton_paged_decode_attention(*a, tuning=t)  # noqa: E731
                            try:
                                sec = time_graph(fn, case, replays=15)
                            except Exception as exc:  # a config that does not compile (registers, smem)
                                sweep.append({"shape": name, **asdict(tune), "error": str(exc)[:200]})
                                continue
                            sweep.append({"shape": name, **asdict(tune), "us": sec * 1e6,
                                          "GBps": case["bytes"] / sec / 1e9})
            best = sorted((s for s in sweep if s["shape"] == name and "us" in s), key=lambda s: s["us"])[:3]
            print("best:", json.dumps(best), flush=True)
        del case
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "decode_attention.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                   "sweep": sweep, "copy_ceiling": CEILING.bandwidth_said() if CEILING else None}, f, indent=1)
    print(f"\n%copy: of {CEILING.bandwidth_said() if CEILING else 'no ceiling'}")
    print(f"{'shape':24} " + " ".join(f"{k + ' GB/s':>13} {'%copy':>6} {'us':>8}" for k in kernels))
    for r in rows:
        print(f"{r['shape']:24} " + " ".join(
            f"{r[k + '_GBps']:13.0f} {100 * r[k + '_GBps'] * 1e9 / COPY_BW:6.1f} {r[k + '_us']:8.1f}" for k in kernels)
            + "  err " + " ".join(f"{r[k + '_rel_err']:.1e}" for k in kernels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
