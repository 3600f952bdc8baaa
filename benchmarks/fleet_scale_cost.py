"""The cost of scale of an infersight fleet (issue 28 item 4), measured on loopback, then modelled.

    .venv/bin/python benchmarks/fleet_scale_cost.py --out out/fleet_scale_cost.json

(a) series: per model shape, one `infersight agent` process (default caps: --max-expert-series 512)
    reads a ring fed with engine-shaped records of that shape (requests of 4 tasks through their
    whole life, decode steps, KV transitions, speculative verifications, and per-step expert counts
    of layers x experts); its /metrics is then scraped SCRAPES times: series (sample lines of the
    text, and cross-checked by prometheus_client's parser), bytes and seconds per scrape (medians).
      dense-8b      32 layers, no experts (Llama-3-8B's shape)
      mixtral-8x7b  32 layers x 8 experts
      moe-61x256    61 layers x 256 experts (DeepSeek-V3's shape as the issue states it)
(b) agent: one agent process reading 1, 2 and 4 rings, each fed the same steady load (a wave of
    WAVE requests decoded for WAVE_TOKENS steps every second, Mixtral's shape): its CPU (cores, from
    /proc utime + stime over the window) and resident memory (VmRSS at the end, VmHWM).
(c) central Prometheus: N = 3 and 16 lightweight nodes (an `infersight agent` each, fed by a
    synthetic ring of Mixtral's shape), scraped every SCRAPE_S by one agent-mode Prometheus that
    labels each target node=node-NN (as a per-node agent-mode Prometheus's external label would) and
    remote-writes to a central Prometheus (--web.enable-remote-write-receiver) that evaluates
    infersight's rule files (`infersight rules`, every 15 s; no dashboard queries). The central's CPU
    (cores, /proc) and RSS over a window, its head series and samples appended per second (its own
    /metrics). One agent-mode sender instead of N: the central's work is the series and samples it
    receives, the same either way; the senders' cost is not measured here.
Then, modelled (labelled so): the central's memory and CPU as a line through the two fleet sizes
(per head series, per sample/s), and the fleet size one Prometheus holds per model shape.

The machine is shared: every timing is a median where repeated, and noisy; the JSON says so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from infersight.bench import agent as bench_agent  # noqa: E402  (its record types, wherever the runtime puts them)
from infersight.bench.serving.process_cpu import process_cpu_s  # noqa: E402
from infersight.exporters.rules import RulesConfig, write_rules  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
#: (layers, experts per layer, experts per token); 0 experts: a dense model.
SHAPES = {"dense-8b": (32, 0, 0), "mixtral-8x7b": (32, 8, 2), "moe-61x256": (61, 256, 8)}
FLEET_SHAPE = "mixtral-8x7b"
TASKS = ("code", "json", "chat", "creative")


@dataclass(frozen=True)
class Sizes:
    """How much of each part to run (the CI test runs a tiny one)."""

    scrapes: int = 15
    wave: int = 32
    wave_tokens: int = 16
    rings: tuple[int, ...] = (1, 2, 4)
    agent_window_s: float = 40.0
    fleets: tuple[int, ...] = (3, 16)
    fleet_warmup_s: float = 45.0
    fleet_window_s: float = 90.0
    #: The deployed scrape interval (deploy/kubernetes/prometheus): at 5 s, 16 Python agents rendering
    #: ~130 kB each per scrape on a loaded 2-core machine missed their scrape timeouts.
    scrape_s: float = 15.0
    scrape_timeout_s: float = 10.0


def feed_wave(probe: ProbeObserver, shape: str, first_id: int, first_step: int, n: int, tokens: int) -> int:
    """n requests of the 4 tasks through their whole life, decoded for `tokens` steps, with this
    shape's expert counts each step; returns the last step id."""
    layers, experts, top_k = SHAPES[shape]
    rng = np.random.default_rng(first_step)
    t = time.monotonic_ns()
    ids = list(range(first_id, first_id + n))
    for rid in ids:
        probe.on_request_arrived(rid, t, 128, TASKS[rid % 4], 0)
        probe.on_request_scheduled(rid, t + 10_000, 128, 32, 12345)
        probe.on_kv_block(bench_agent.KVBlockEvent.ALLOCATED, rid % 64, rid, 0)
        probe.on_prefill_chunk(rid, t + 10_000, t + 2_000_000, 0, 128)
        probe.on_first_token(rid, t + 2_000_000)
    step = first_step
    for _ in range(tokens):
        step += 1
        t += 20_000_000
        for rid in ids:
            probe.on_tokens_emitted(rid, t, 1)
            probe.on_spec_verified(rid, 4, 2, [True, True, False], 1000, 4000)
        if experts:  # each token goes to top_k experts of every layer
            counts = rng.multinomial(n * top_k, np.full(experts, 1 / experts), size=layers).astype(np.int64)
            probe.on_expert_counts(step, torch.from_numpy(counts))
        probe.on_step_end(bench_agent.StepStats(step, t - 15_000_000, t, num_decode_tokens=n, kv_blocks_in_use=40,
                                                kv_blocks_total=64, kv_block_size=16, batch=[(r, 1) for r in ids]))
    for rid in ids:
        probe.on_kv_block(bench_agent.KVBlockEvent.CACHED, rid % 64, rid, 777)
        probe.on_request_finished(rid, t + 1, "length", tokens)
    return step


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 30) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def wait_for(check, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready in {timeout:.0f} s")
        time.sleep(0.2)


def start_agents(stack: ExitStack, ring_sets: list[list[str]], model: str, logs: list[Path]) -> list[str]:
    """One `infersight agent` process per ring set, started together (a loaded machine starts Python
    slowly); returns their HOST:PORTs once each has its rings. AGENT_PIDS maps each to its pid."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    addresses = []
    for rings, log in zip(ring_sets, logs):
        port = free_port()
        out = open(log, "wb")
        stack.callback(out.close)
        proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", *(a for r in rings for a in ("--ring", r)),
                                 "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.25", "--model-name", model],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        stack.callback(bench_agent.stop_agent, proc)
        addresses.append(f"127.0.0.1:{port}")
        AGENT_PIDS[addresses[-1]] = proc.pid
    for address, rings in zip(addresses, ring_sets):
        wait_for(lambda: sorted(json.loads(get(f"http://{address}/health", 2))["rings"]) == sorted(rings),
                 f"agent {address}", timeout=300)
    return addresses


AGENT_PIDS: dict[str, int] = {}


def steps_shown(address: str) -> float:
    m = re.search(rb"^infersight_steps_total\{[^}]*\} ([0-9.e+]+)$|^infersight_steps_total ([0-9.e+]+)$",
                  get(f"http://{address}/metrics"), re.M)
    return float(m.group(1) or m.group(2)) if m else 0.0


def count_series(text: str) -> tuple[int, int]:
    """Series in an exposition two ways: its sample lines, and the parser's samples."""
    lines = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    parsed = sum(len(f.samples) for f in text_string_to_metric_families(text))
    return lines, parsed


def measure_series(sizes: Sizes, work: Path) -> dict[str, dict]:
    """(a): series, bytes and seconds per scrape for each model shape."""
    out = {}
    for shape in SHAPES:
        with ExitStack() as stack:
            ring = f"infersight-scale-{shape}-{os.getpid()}-{time.monotonic_ns()}"
            probe = ProbeObserver(ProbeConfig(ring_name=ring, ring_capacity=1 << 18, nvtx=False))
            stack.callback(probe.close)
            address, = start_agents(stack, [[ring]], shape, [work / f"agent-{shape}.log"])
            last = feed_wave(probe, shape, 0, 0, sizes.wave, sizes.wave_tokens)
            wait_for(lambda: steps_shown(address) >= last, f"{shape}'s steps on /metrics")
            times, sizes_b, texts = [], [], []
            for _ in range(sizes.scrapes):
                t0 = time.perf_counter()
                body = get(f"http://{address}/metrics")
                times.append(time.perf_counter() - t0)
                sizes_b.append(len(body))
                texts.append(body.decode())
            lines, parsed = count_series(texts[-1])
            families: dict[str, int] = {}
            for line in texts[-1].splitlines():
                if line and not line.startswith("#"):
                    name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
                    name = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
                    families[name] = families.get(name, 0) + 1
            out[shape] = {"layers": SHAPES[shape][0], "experts": SHAPES[shape][1], "series": lines,
                          "series_parsed": parsed, "scrape_bytes_median": statistics.median(sizes_b),
                          "scrape_seconds_median": statistics.median(times), "scrapes": len(times),
                          "dropped_slots": probe.ring.stats()["dropped"],
                          "families": dict(sorted(families.items(), key=lambda kv: (-kv[1], kv[0])))}
    return out


def _vm(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Feeder:
    """A thread writing one wave every `every_s` to each probe (round robin), until stopped."""

    def __init__(self, probes: list[ProbeObserver], shape: str, sizes: Sizes, every_s: float = 1.0) -> None:
        self.probes, self.shape, self.sizes, self.every_s = probes, shape, sizes, every_s
        self.waves = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        step = 0
        while not self._stop.is_set():
            t0 = time.monotonic()
            for i, probe in enumerate(self.probes):  # request ids unique across rings (one agent may read them all)
                first_id = (self.waves * len(self.probes) + i) * self.sizes.wave
                step = feed_wave(probe, self.shape, first_id, step, self.sizes.wave, self.sizes.wave_tokens)
            self.waves += 1
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - t0)))

    def __enter__(self) -> "Feeder":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _rings(stack: ExitStack, n: int, tag: str) -> tuple[list[str], list[ProbeObserver]]:
    names = [f"infersight-scale-{tag}{i}-{os.getpid()}-{time.monotonic_ns()}" for i in range(n)]
    probes = [ProbeObserver(ProbeConfig(ring_name=r, ring_capacity=1 << 18, nvtx=False)) for r in names]
    for p in probes:
        stack.callback(p.close)
    return names, probes


def measure_agent(sizes: Sizes, work: Path) -> dict[str, dict]:
    """(b): one agent's CPU and memory reading 1, 2 and 4 rings under the same load per ring."""
    out = {}
    for n in sizes.rings:
        with ExitStack() as stack:
            names, probes = _rings(stack, n, "r")
            address, = start_agents(stack, [names], FLEET_SHAPE, [work / f"agent-{n}rings.log"])
            pid = AGENT_PIDS[address]
            with Feeder(probes, FLEET_SHAPE, sizes) as feeder:
                time.sleep(min(5.0, sizes.agent_window_s / 4))  # past its first polls
                c0, t0, w0 = process_cpu_s(pid), time.monotonic(), feeder.waves
                time.sleep(sizes.agent_window_s)
                cpu, wall, waves = process_cpu_s(pid) - c0, time.monotonic() - t0, feeder.waves - w0
            out[str(n)] = {"rings": n, "cores": cpu / wall, "window_s": wall, "rss_mib": _vm(pid, "VmRSS"),
                           "peak_rss_mib": _vm(pid, "VmHWM"),
                           "steps_per_s_per_ring": waves * sizes.wave_tokens / wall,
                           "tokens_per_s_per_ring": waves * sizes.wave_tokens * sizes.wave / wall,
                           "dropped_slots": sum(p.ring.stats()["dropped"] for p in probes)}
    return out


def _prom_metric(url: str, name: str) -> float:
    """A Prometheus's own metric, summed over its label variants (2.42 splits samples by type)."""
    values = re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", get(f"{url}/metrics").decode(), re.M)
    return sum(float(v) for v in values) if values else float("nan")


def measure_central(sizes: Sizes, work: Path) -> dict[str, dict]:
    """(c): the central Prometheus's CPU, memory, head series and samples/s at each fleet size."""
    out = {}
    for n in sizes.fleets:
        run = work / f"fleet{n}"
        run.mkdir()
        with ExitStack() as stack:
            names, probes = _rings(stack, n, "n")
            agents = start_agents(stack, [[r] for r in names], FLEET_SHAPE,
                                  [run / f"agent{i}.log" for i in range(n)])
            central_port, sender_port = free_port(), free_port()
            central = f"http://127.0.0.1:{central_port}"
            # The central as the fleet runs it: infersight's rule files loaded and evaluated (every 15 s).
            write_rules(run / "rules", RulesConfig(agent_selector='job="infersight"'))
            (run / "central.yml").write_text(f"global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n"
                                             f"rule_files:\n  - {run / 'rules'}/*.rules.yml\n")
            targets = "\n".join(f"      - targets: ['{a}']\n        labels: {{node: node-{i:02d}}}"
                                for i, a in enumerate(agents))
            (run / "sender.yml").write_text(f"""global:
  scrape_interval: {sizes.scrape_s:g}s
  scrape_timeout: {sizes.scrape_timeout_s:g}s
scrape_configs:
  - job_name: infersight
    static_configs:
{targets}
remote_write:
  - url: {central}/api/v1/write
""")
            procs = []
            for role, argv in (("central", [PROMETHEUS, f"--config.file={run / 'central.yml'}",
                                            f"--storage.tsdb.path={run / 'central-data'}",
                                            f"--web.listen-address=127.0.0.1:{central_port}",
                                            "--web.enable-remote-write-receiver"]),
                               ("sender", [PROMETHEUS, "--enable-feature=agent", f"--config.file={run / 'sender.yml'}",
                                           f"--storage.agent.path={run / 'sender-wal'}",
                                           f"--web.listen-address=127.0.0.1:{sender_port}"])):
                log = open(run / f"{role}.log", "wb")
                stack.callback(log.close)
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
                stack.callback(bench_agent.stop_agent, proc)  # SIGTERM, SIGKILL after 15 s
                procs.append(proc)
            wait_for(lambda: get(f"{central}/-/ready", 2) is not None, "central Prometheus")
            with Feeder(probes, FLEET_SHAPE, sizes, every_s=max(1.0, n / 4)):
                time.sleep(sizes.fleet_warmup_s)
                pid = procs[0].pid
                c0, t0 = process_cpu_s(pid), time.monotonic()
                a0 = _prom_metric(central, "prometheus_tsdb_head_samples_appended_total")
                time.sleep(sizes.fleet_window_s)
                cpu, wall = process_cpu_s(pid) - c0, time.monotonic() - t0
                appended = _prom_metric(central, "prometheus_tsdb_head_samples_appended_total") - a0
                head = _prom_metric(central, "prometheus_tsdb_head_series")
                heap = _prom_metric(central, "go_memstats_heap_inuse_bytes")
                up = json.loads(get(f"{central}/api/v1/query?query=count(up%3D%3D1)"))["data"]["result"]
            out[str(n)] = {"nodes": n, "nodes_up": int(float(up[0]["value"][1])) if up else 0,
                           "head_series": head, "samples_per_s": appended / wall, "cores": cpu / wall,
                           "rss_mib": _vm(pid, "VmRSS"), "heap_inuse_mib": heap / 2**20, "window_s": wall,
                           "scrape_interval_s": sizes.scrape_s}
    return out


def model(series: dict[str, dict], central: dict[str, dict], scrape_s: float = 15.0,
          memory_budget_gib: float = 32.0, cores_budget: float = 4.0) -> dict[str, object]:
    """Modelled: a line through the measured fleet sizes for the central's memory per head series and
    CPU per sample/s, then the nodes one Prometheus holds in the budgets, per shape, at scrape_s."""
    pts = sorted((r for r in central.values() if r["nodes_up"] == r["nodes"]), key=lambda r: r["nodes"])
    if len(pts) < 2:
        return {"basis": "not modelled: fewer than two fleet sizes had every node up"}
    lo, hi = pts[0], pts[-1]
    d_series = hi["head_series"] - lo["head_series"]
    mib_per_series = (hi["rss_mib"] - lo["rss_mib"]) / d_series
    base_mib = lo["rss_mib"] - mib_per_series * lo["head_series"]
    cores_per_sample_s = (hi["cores"] - lo["cores"]) / (hi["samples_per_s"] - lo["samples_per_s"])
    out: dict[str, object] = {"basis": "modelled from the measured fleet sizes " + ", ".join(str(p["nodes"]) for p in pts),
                              "bytes_per_head_series": mib_per_series * 2**20, "base_rss_mib": base_mib,
                              "cores_per_1k_samples_per_s": cores_per_sample_s * 1000, "scrape_interval_s": scrape_s,
                              "memory_budget_gib": memory_budget_gib, "cores_budget": cores_budget, "per_shape": {}}
    for shape, s in series.items():
        by_memory = (memory_budget_gib * 1024 - base_mib) / (mib_per_series * s["series"])
        by_cpu = cores_budget / (cores_per_sample_s * s["series"] / scrape_s) if cores_per_sample_s > 0 else float("inf")
        out["per_shape"][shape] = {"series_per_node": s["series"], "nodes_by_memory": int(by_memory),
                                   "nodes_by_cpu": int(by_cpu), "nodes": int(min(by_memory, by_cpu))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/fleet_scale_cost.json")
    parser.add_argument("--tiny", action="store_true", help="a quick run (CI): few scrapes, short windows, 1-2 nodes")
    parser.add_argument("--parts", default="series,agent,central", help="comma-separated: series, agent, central")
    parser.add_argument("--reuse", help="an earlier run's JSON: the parts not run now are taken from it (and say so)")
    args = parser.parse_args(argv)
    sizes = Sizes(scrapes=3, wave=8, wave_tokens=4, rings=(1, 2), agent_window_s=3, fleets=(1, 2),
                  fleet_warmup_s=12, fleet_window_s=6, scrape_s=2, scrape_timeout_s=2) if args.tiny else Sizes()
    parts = set(args.parts.split(","))
    result: dict[str, object] = {
        "what": "fleet scale cost (issue 28 item 4)", "command": " ".join(["benchmarks/fleet_scale_cost.py", *(argv or sys.argv[1:])]),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": sizes.__dict__ | {"rings": list(sizes.rings),
                                                                                          "fleets": list(sizes.fleets)},
        "note": "measured on a shared, loaded machine: timings are medians where repeated and noisy"}
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        work = Path(tmp)
        if "series" in parts:
            result["series"] = measure_series(sizes, work)
        if "agent" in parts:
            result["agent"] = measure_agent(sizes, work)
        if "central" in parts:
            result["central"] = measure_central(sizes, work)
    if args.reuse:
        earlier = json.loads(Path(args.reuse).read_text())
        for part in ("series", "agent", "central"):
            if part not in result and part in earlier:
                result[part] = earlier[part]
                result.setdefault("reused", {})[part] = f"{earlier['date']}: {earlier['command']}"  # type: ignore[index]
    if "series" in result and "central" in result and len(result["central"]) > 1:  # type: ignore[arg-type]
        result["model"] = model(result["series"], result["central"])  # type: ignore[arg-type]
    result["load_at_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
