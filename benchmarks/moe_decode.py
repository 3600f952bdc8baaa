"""One mixtral-shape MoE layer at decode batch sizes on the GPU: the per-expert loop (host sync per
layer) against the sync-free grouped and padded paths, against the roofline of the expert weights
the batch touches.

    python3 benchmarks/moe_decode.py [--batch 16] [--layers 2]

Each timed unit runs `layers` distinct MoE layers (each 2.8 GB of experts, far past the L2) one
after another; eager with CUDA events, and for the sync-free paths also as a CUDA graph (the loop
cannot be captured: it reads counts on the host). Median of many repeats. Roofline: bytes of the
experts routed to at least one token (plus the router) / the GPU's copy bandwidth (measured by
`infersight bench ceilings` when cached, else the datasheet's: printed with the table). Prints a
table last; writes JSON to $OUT/moe_decode.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings  # noqa: E402
from infersight.runtime.model.model_config import MODEL_CONFIGS  # noqa: E402
from infersight.runtime.model.moe import MoEFFN, route  # noqa: E402
from infersight.runtime.ranges import RangeMarker, layer_range_names  # noqa: E402

#: The roofline's ceiling: this GPU's copy bandwidth (bytes read + written) as `infersight bench
#: ceilings` measured and cached it, else its datasheet's; the table names which.
CEILING = (lookup_ceilings(torch.cuda.get_device_name(), "bfloat16", given_as=None)
           if torch.cuda.is_available() else None)
COPY_BW = CEILING.ceilings.peak_gbps * 1e9 if CEILING is not None and CEILING.ceilings else float("nan")


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    cfg = MODEL_CONFIGS["mixtral-shape"]
    torch.manual_seed(0)
    with torch.device("cuda"):
        moes = [MoEFFN(cfg, RangeMarker(), layer_range_names(i)).to(torch.bfloat16).eval() for i in range(args.layers)]
    for moe in moes:
        for p in moe.parameters():
            torch.nn.init.normal_(p, 0.0, 0.02)
    x = torch.randn(args.batch, cfg.d_model, device="cuda", dtype=torch.bfloat16)
    expert_bytes = 3 * cfg.d_model * cfg.ffn_dim * 2
    with torch.no_grad():
        touched = sum(int(route(m.router(x), cfg.top_k)[1].unique().numel()) for m in moes)
    roof_bytes = touched * expert_bytes + args.layers * cfg.d_model * cfg.n_experts * 2
    counts = torch.zeros(args.layers, cfg.n_experts, dtype=torch.long, device="cuda")
    results, outs = {}, {}

    def run_all() -> torch.Tensor:
        y = x
        for i, m in enumerate(moes):
            y = m(x, counts[i]) + y  # distinct inputs per layer would change the routing; keep x
        return y

    with torch.inference_mode():
        for path in ("loop", "grouped", "padded"):
            for m in moes:
                m.expert_path = path
            try:
                outs[path] = run_all().float()
            except Exception as exc:  # e.g. no _grouped_mm here
                results[path] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            torch.cuda.synchronize()
            eager = timed(run_all, args.repeats)
            res = {"eager_ms_per_layer": eager * 1e3 / args.layers}
            if path != "loop":
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    run_all()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    run_all()
                graph.replay()
                torch.cuda.synchronize()
                res["graph_ms_per_layer"] = timed(graph.replay, args.repeats) * 1e3 / args.layers
            best = min(v for k, v in res.items() if k.endswith("ms_per_layer")) / 1e3 * args.layers
            res["pct_of_expert_roofline"] = 100 * roof_bytes / COPY_BW / best
            res["rel_diff_vs_loop"] = float((outs[path] - outs["loop"]).abs().max() / outs["loop"].abs().max())
            results[path] = res
            print(path, json.dumps(res), flush=True)
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch,
               "layers": args.layers, "experts_touched_per_layer": touched / args.layers,
               "roofline_ms_per_layer": roof_bytes / COPY_BW * 1e3 / args.layers, "paths": results,
               "copy_ceiling": CEILING.bandwidth_said() if CEILING else None}
    with open(os.path.join(os.environ.get("OUT", "."), f"moe_decode_b{args.batch}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nmixtral-shape MoE layer, batch {args.batch}: {touched / args.layers:.1f} experts touched, "
          f"roofline {summary['roofline_ms_per_layer']:.3f} ms/layer at {summary['copy_ceiling']}")
    print(f"{'path':8} {'eager ms':>9} {'graph ms':>9} {'% roof':>7} {'rel diff':>9}")
    for path, r in results.items():
        if "error" in r:
            print(f"{path:8} {r['error']}")
            continue
        print(f"{path:8} {r['eager_ms_per_layer']:9.3f} {r.get('graph_ms_per_layer', float('nan')):9.3f} "
              f"{r['pct_of_expert_roofline']:7.1f} {r['rel_diff_vs_loop']:9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
