"""What the expert-count plugin costs a real vLLM serving the tiny Mixtral (4 layers, 4 experts, top-2).

One server per arm, arms interleaved (default off,hooks,on,off,hooks,on), the same workload repeated
in each (8 completions of 32 tokens, 4 at a time, after two warm-up rounds):
  off   INFERSIGHT_EXPERT_COUNTS=0: no plugin;
  hooks INFERSIGHT_EXPERT_COUNTS=hooks: every hook and ring write, but no counting callback;
  on    the plugin as shipped.
Measured:
1. Direct, in the plugin's own accumulators (INFERSIGHT_EXPERT_TIMING), per engine step: the root's
   pre/post-forward hooks (snapshot, zero, ring write), in wall time and in the worker thread's CPU
   time (thread_time: robust when other work shares the cores), and the model forward between them.
   The counting inside the compiled graph is not a Python call: its cost is forward(on) - forward(hooks).
   With --enforce-eager the counting runs as Python and is timed directly as well.
2. A/B, wall clock: vLLM's mean inter-token latency (vllm:inter_token_latency_seconds), on vs off.
Per arm the median over repetitions; per kind the median over its servers. Noise floor: the spread
between the servers of one kind (A/A), relative to their mean.

    .venv/bin/python benchmarks/vllm_expert_cost.py [--repetitions 7] [--enforce-eager] [--json]

Prints `key: value` lines, then one JSON object as the last line (--json: only the JSON).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from infersight.vllm.launch import VllmServer, VllmServerConfig, VllmUnavailable, build_tiny_model

MODEL = "tiny-mixtral"
PROMPTS = [("the cache block token expert " * n).strip() for n in (2, 5, 3, 8, 4, 6, 1, 7)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _complete(base: str, prompt: str, max_tokens: int) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def _itl(base: str) -> tuple[float, float]:
    """vLLM's inter-token latency histogram: (sum of seconds, count)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    total = count = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:inter_token_latency_seconds_sum":
                total += s.value
            elif s.name == "vllm:inter_token_latency_seconds_count":
                count += s.value
    return total, count


def _timing_snapshot(base: str, path: Path) -> dict[str, float] | None:
    """The plugin rewrites its timing file at a step at least 1 s after the last write: wait, run
    one 1-token request (one step), read."""
    time.sleep(1.2)
    _complete(base, "flush", 1)
    return json.loads(path.read_text()) if path.is_file() else None


def run_arm(model: Path, kind: str, args: argparse.Namespace, workdir: Path, index: int) -> dict[str, object]:
    timing = workdir / f"timing-{index}.json"
    switch = {"off": "0", "hooks": "hooks", "on": "1"}[kind]
    env = {"INFERSIGHT_EXPERT_COUNTS": switch, "INFERSIGHT_EXPERT_TIMING": str(timing)}
    extra = ["--enforce-eager"] if args.enforce_eager else []
    config = VllmServerConfig(model=str(model), port=_free_port(), served_model_name=MODEL, enable_prefix_caching=False,
                              max_num_seqs=args.concurrency, cwd=str(workdir), env=env, extra_args=extra)
    with VllmServer(config, log_path=workdir / f"vllm-{index}.log") as server:
        base = server.url

        def workload() -> None:
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(lambda p: _complete(base, p, args.max_tokens), PROMPTS))

        for _ in range(2):  # warm-up: first-step allocations, tokenizer, HTTP
            workload()
        before = _timing_snapshot(base, timing) if kind != "off" else None
        itl = []
        for _ in range(args.repetitions):
            s0, c0 = _itl(base)
            workload()
            s1, c1 = _itl(base)
            itl.append((s1 - s0) / max(1.0, c1 - c0))
        after = _timing_snapshot(base, timing) if kind != "off" else None
    out: dict[str, object] = {"arm": kind, "itl_median_s": statistics.median(itl), "itl_s": itl}
    if before and after:
        steps = max(1, after["steps"] - before["steps"])
        per_step = {f"{k[:-3]}_us_per_step": (after[k] - before[k]) / steps / 1e3 for k in HOOK_FIELDS}
        out.update(steps=steps, count_calls_per_step=(after["count_calls"] - before["count_calls"]) / steps, **per_step)
    return out


HOOK_FIELDS = ("boundary_ns", "boundary_cpu_ns", "count_ns", "count_cpu_ns", "forward_ns", "forward_cpu_ns")


def _by_kind(arms: list[dict[str, object]], key: str, kind: str) -> tuple[float | None, float | None]:
    """(median over the servers of one kind, their A/A spread relative to the mean)."""
    values = [float(a[key]) for a in arms if a["arm"] == kind and key in a]
    if not values:
        return None, None
    spread = (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 and any(values) else None
    return statistics.median(values), spread


def summarize(arms: list[dict[str, object]]) -> dict[str, object]:
    itl_on, noise_on = _by_kind(arms, "itl_median_s", "on")
    itl_off, noise_off = _by_kind(arms, "itl_median_s", "off")
    fwd_on, fwd_noise_on = _by_kind(arms, "forward_cpu_us_per_step", "on")
    fwd_hooks, fwd_noise_hooks = _by_kind(arms, "forward_cpu_us_per_step", "hooks")
    boundary_cpu, _ = _by_kind(arms, "boundary_cpu_us_per_step", "on")
    boundary_wall, _ = _by_kind(arms, "boundary_us_per_step", "on")
    count_cpu, _ = _by_kind(arms, "count_cpu_us_per_step", "on")
    out: dict[str, object] = {
        "itl_off_ms": itl_off and itl_off * 1e3, "itl_on_ms": itl_on and itl_on * 1e3,
        "ab_overhead_itl": itl_on / itl_off - 1 if itl_on and itl_off else None,
        "noise_floor_itl": max(n for n in (noise_on, noise_off, 0.0) if n is not None),
        "boundary_us_per_step": boundary_wall, "boundary_cpu_us_per_step": boundary_cpu,
        "count_cpu_us_per_step": count_cpu, "forward_cpu_us_per_step_on": fwd_on,
        "forward_cpu_us_per_step_hooks": fwd_hooks,
        "noise_floor_forward_cpu": max(n for n in (fwd_noise_on, fwd_noise_hooks, 0.0) if n is not None)}
    if None not in (fwd_on, fwd_hooks, boundary_cpu):
        # the plugin's CPU per step: its hooks, the counting timed as Python (eager only), and what the
        # counting adds inside the compiled graph (forward with counting - forward without).
        in_graph = fwd_on - fwd_hooks - (count_cpu or 0.0)
        total = boundary_cpu + (count_cpu or 0.0) + in_graph
        out.update(in_graph_count_cpu_us_per_step=in_graph, plugin_cpu_us_per_step=total,
                   plugin_share_of_forward=total / fwd_hooks,
                   plugin_share_of_step=total / (itl_off * 1e6) if itl_off else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a Mixtral-like checkpoint (default: build the tiny Mixtral)")
    p.add_argument("--arms", default="off,hooks,on,off,hooks,on")
    p.add_argument("--repetitions", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile: counting runs as Python")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",")]
    if not arms or any(a not in ("on", "hooks", "off") for a in arms) or args.repetitions < 1:
        print("error: --arms takes off, hooks and on; --repetitions at least 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="infersight-expert-cost-") as tmp:
        workdir = Path(tmp)
        try:
            model = Path(args.model) if args.model else build_tiny_model(workdir / "tiny-mixtral", "mixtral")
            results = [run_arm(model, arm, args, workdir, i) for i, arm in enumerate(arms)]
        except VllmUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    report = {"config": {"arms": arms, "repetitions": args.repetitions, "concurrency": args.concurrency,
                         "max_tokens": args.max_tokens, "requests": len(PROMPTS), "enforce_eager": args.enforce_eager},
              **summarize(results), "arms": results}
    if not args.json:
        for k, v in report.items():
            if k not in ("arms", "config"):
                print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
