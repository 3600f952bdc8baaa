"""What the expert-count plugin costs a real vLLM serving the tiny Mixtral (4 layers, 4 experts, top-2).

One server per arm, arms interleaved, the same workload repeated in each (8 completions of 32
tokens, 4 at a time, after two warm-up rounds). Arm kinds:
  off        INFERSIGHT_EXPERT_COUNTS=0: no plugin;
  on         the plugin as shipped (its publisher thread times itself: INFERSIGHT_EXPERT_TIMING);
  hooks-fwd  INFERSIGHT_EXPERT_COUNTS=hooks + INFERSIGHT_EXPERT_TIME_FORWARDS=1: no counting callback,
             every forward timed by the plugin's hooks;
  on-fwd     counting, every forward timed the same way.
Measured, in CPU time of the thread concerned (thread_time: time preempted by other work sharing
the cores does not count) and in wall time:
1. Direct: the publisher thread's time, per engine step (steps: vllm:iteration_tokens_total).
   After the first real step the plugin runs no Python in a step; the counting inside the compiled
   graph is not a Python call, so its cost is forward(on-fwd) - forward(hooks-fwd). With
   --enforce-eager the counting is Python and is timed directly as well.
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


def _vllm_sums(base: str) -> dict[str, float]:
    """From vLLM's /metrics: the inter-token latency histogram (sum, count) and the step count."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    wanted = {"vllm:inter_token_latency_seconds_sum": "itl_sum", "vllm:inter_token_latency_seconds_count": "itl_count",
              "vllm:iteration_tokens_total_count": "steps"}
    out = dict.fromkeys(wanted.values(), 0.0)
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def _timing(path: Path) -> dict[str, dict[str, int]]:
    """The plugin's timing file, after the publisher's next rewrite (about once a second)."""
    time.sleep(1.5)
    return json.loads(path.read_text()) if path.is_file() else {}


ARM_ENV = {"off": {"INFERSIGHT_EXPERT_COUNTS": "0"}, "on": {"INFERSIGHT_EXPERT_COUNTS": "1"},
           "hooks-fwd": {"INFERSIGHT_EXPERT_COUNTS": "hooks", "INFERSIGHT_EXPERT_TIME_FORWARDS": "1"},
           "on-fwd": {"INFERSIGHT_EXPERT_COUNTS": "1", "INFERSIGHT_EXPERT_TIME_FORWARDS": "1"}}


def _per_call_us(before: dict, after: dict, name: str, per: float | None = None) -> dict[str, float]:
    """Wall and CPU microseconds of timing entry ``name``, per call (or per ``per`` units)."""
    b, a = before.get(name, {}), after.get(name, {})
    calls = per if per is not None else a.get("calls", 0) - b.get("calls", 0)
    if not calls or name not in after:
        return {}
    return {f"{name}_us_per_step": (a["wall_ns"] - b.get("wall_ns", 0)) / calls / 1e3,
            f"{name}_cpu_us_per_step": (a["cpu_ns"] - b.get("cpu_ns", 0)) / calls / 1e3}


def run_arm(model: Path, kind: str, args: argparse.Namespace, workdir: Path, index: int) -> dict[str, object]:
    timing = workdir / f"timing-{index}.json"
    env = {**ARM_ENV[kind], "INFERSIGHT_EXPERT_TIMING": str(timing)}
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
        before, start = _timing(timing), _vllm_sums(base)
        itl, last = [], start
        for _ in range(args.repetitions):
            workload()
            now = _vllm_sums(base)
            itl.append((now["itl_sum"] - last["itl_sum"]) / max(1.0, now["itl_count"] - last["itl_count"]))
            last = now
        after = _timing(timing)
    steps = last["steps"] - start["steps"]
    out: dict[str, object] = {"arm": kind, "steps": steps, "itl_median_s": statistics.median(itl), "itl_s": itl}
    out.update(_per_call_us(before, after, "publish", per=steps))  # the thread's time, per engine step
    out.update(_per_call_us(before, after, "forward"))
    out.update(_per_call_us(before, after, "pre_hook"))
    out.update(_per_call_us(before, after, "count", per=(after.get("forward", {}).get("calls", 0)
                                                         - before.get("forward", {}).get("calls", 0)) or None))
    return out


def _by_kind(arms: list[dict[str, object]], key: str, kind: str) -> tuple[float | None, float | None]:
    """(median over the servers of one kind, their A/A spread relative to the mean)."""
    values = [float(a[key]) for a in arms if a["arm"] == kind and key in a]
    if not values:
        return None, None
    spread = (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 and any(values) else None
    return statistics.median(values), spread


def _worst(*spreads: float | None) -> float | None:
    known = [s for s in spreads if s is not None]
    return max(known) if known else None


def summarize(arms: list[dict[str, object]]) -> dict[str, object]:
    itl_on, noise_on = _by_kind(arms, "itl_median_s", "on")
    itl_off, noise_off = _by_kind(arms, "itl_median_s", "off")
    fwd_on, fwd_noise_on = _by_kind(arms, "forward_cpu_us_per_step", "on-fwd")
    fwd_hooks, fwd_noise_hooks = _by_kind(arms, "forward_cpu_us_per_step", "hooks-fwd")
    publish_cpu, _ = _by_kind(arms, "publish_cpu_us_per_step", "on")
    count_cpu, _ = _by_kind(arms, "count_cpu_us_per_step", "on-fwd")
    out: dict[str, object] = {
        "itl_off_ms": itl_off and itl_off * 1e3, "itl_on_ms": itl_on and itl_on * 1e3,
        "ab_overhead_itl": itl_on / itl_off - 1 if itl_on and itl_off else None,
        "noise_floor_itl": _worst(noise_on, noise_off),
        "publish_cpu_us_per_step": publish_cpu, "count_cpu_us_per_step": count_cpu,
        "forward_cpu_us_on": fwd_on, "forward_cpu_us_hooks": fwd_hooks,
        "noise_floor_forward_cpu": _worst(fwd_noise_on, fwd_noise_hooks)}
    if fwd_on is not None and fwd_hooks is not None:
        # what counting adds to a forward: inside the compiled graph, plus (eager) the timed Python calls
        in_forward = fwd_on - fwd_hooks
        total = in_forward + (publish_cpu or 0.0)
        out.update(counting_in_forward_cpu_us=in_forward, plugin_cpu_us_per_step=total,
                   plugin_share_of_forward=total / fwd_hooks,
                   plugin_share_of_step=total / (itl_off * 1e6) if itl_off else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a Mixtral-like checkpoint (default: build the tiny Mixtral)")
    p.add_argument("--arms", default="off,on,hooks-fwd,on-fwd,off,on,hooks-fwd,on-fwd")
    p.add_argument("--repetitions", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile: counting runs as Python")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",")]
    if not arms or any(a not in ARM_ENV for a in arms) or args.repetitions < 1:
        print(f"error: --arms takes {', '.join(ARM_ENV)}; --repetitions at least 1", file=sys.stderr)
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
