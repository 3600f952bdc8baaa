"""The agent's memory under sustained load: does its resident set level off, and where?

A separate `infersight agent` process reads one probe ring that this script fills at a steady
request rate with the engine-shaped synthetic stream of `infersight bench agent`
(bench.agent.synthetic_workload: requests through their whole life, steps with batch rows, KV
transitions, MoE counts, verifications), in small waves, for --duration seconds. Every --sample-s
the agent's memory is read from /proc/PID/status, all measured:

    rss      VmRSS: what the issue's figures are (94 -> 209 MB in three minutes at ~13 requests/s)
    anon     RssAnon: the agent's own heap (Python objects, frames, numpy arrays)
    shmem    RssShmem: the probe ring's pages the agent has touched (bounded by the ring's size,
             18 MiB at the default 65,536 slots: shared with the engine, not the agent's to free)

and its retained requests and their bytes from /api/v1/summary's `retention` block (-1: the summary
did not answer within 20 s, counted in summary_timeouts; an agent without that block also shows -1).
The last lines give the growth over the second half of the run (MB per minute): about 0 at a plateau.

    # the issue's rate for three minutes, default retention budget
    python benchmarks/agent_memory_soak.py --rate 13 --duration 180
    # faster (the same requests in less time), a smaller budget
    python benchmarks/agent_memory_soak.py --rate 100 --duration 180 --agent-arg=--retention-mib=16

Prints one line per sample, then `key: value` lines, then one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infersight.bench.agent import stop_agent, synthetic_workload  # noqa: E402
from infersight.probes.config import ProbeConfig  # noqa: E402
from infersight.probes.observer import ProbeObserver  # noqa: E402


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssShmem of a process (Linux /proc), in MiB."""
    keys = {"VmRSS:": "rss", "RssAnon:": "anon", "RssShmem:": "shmem"}
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(maxsplit=1)[0] if line else ""
        if key in keys:
            out[keys[key]] = int(line.split()[1]) / 1024
    return out


def _get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=20).read())


def _slope(samples: list[dict], key: str) -> float:
    """Least-squares slope of samples[key] over time, MB per minute."""
    n = len(samples)
    if n < 2:
        return float("nan")
    ts, ys = [s["t_s"] for s in samples], [s[key] for s in samples]
    mt, my = sum(ts) / n, sum(ys) / n
    den = sum((t - mt) ** 2 for t in ts)
    return 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / den if den else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=13.0, help="requests per second (default 13, the issue's)")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per request (one step each)")
    ap.add_argument("--wave", type=int, default=4, help="requests per wave (decoded together)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples")
    ap.add_argument("--agent-arg", action="append", default=[], help="extra `infersight agent` argument (repeatable)")
    args = ap.parse_args()

    name = f"infersight-memsoak-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))  # the default ring size
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "infersight", "agent", "--ring", name, "--listen", f"127.0.0.1:{port}",
           "--gpu-source", "none", *args.agent_arg]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    samples: list[dict] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the agent did not start") from None
                time.sleep(0.1)
        print(f"agent pid {proc.pid}: {' '.join(cmd[1:])}", flush=True)
        print(f"{'t_s':>6} {'requests':>9} {'rss_mb':>7} {'anon_mb':>8} {'shmem_mb':>8} {'kept':>6} {'kept_mib':>8}",
              flush=True)
        start = time.monotonic()
        next_sample, rid, step, summary_timeouts = start, 0, 0, 0
        wave_s = args.wave / args.rate
        while True:
            now = time.monotonic()
            if now >= next_sample:
                try:  # an agent that falls behind may not answer in time: a sample without its counts
                    kept = _get(url + "/api/v1/summary").get("retention", {})
                except OSError:
                    kept, summary_timeouts = {"requests": -1}, summary_timeouts + 1
                sample = {"t_s": round(now - start, 1), "requests": rid, **memory_mb(proc.pid),
                          "kept": kept.get("requests", -1), "kept_mib": kept.get("bytes", 0) / 2**20}
                samples.append(sample)
                print(f"{sample['t_s']:>6.0f} {rid:>9} {sample['rss']:>7.1f} {sample['anon']:>8.1f} "
                      f"{sample['shmem']:>8.1f} {sample['kept']:>6} {sample['kept_mib']:>8.2f}", flush=True)
                next_sample += args.sample_s
            if now - start >= args.duration:
                break
            step = synthetic_workload(probe, args.wave, args.tokens, first_id=rid, first_step=step)
            rid += args.wave
            time.sleep(max(0.0, start + rid / args.rate - time.monotonic()))
    finally:
        stop_agent(proc)
        dropped = probe.ring.stats()["dropped"]
        probe.close()
    half = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2]
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "machine": platform.node(),
        "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "requests": rid, "ring_dropped_slots": dropped,
        "rss_first_mb": samples[0]["rss"], "rss_peak_mb": max(s["rss"] for s in samples),
        "rss_last_mb": samples[-1]["rss"], "anon_last_mb": samples[-1]["anon"],
        "anon_slope_second_half_mb_per_min": round(_slope(half, "anon"), 2),
        "rss_slope_second_half_mb_per_min": round(_slope(half, "rss"), 2),
        "kept_last": samples[-1]["kept"], "kept_mib_last": round(samples[-1]["kept_mib"], 2),
        "summary_timeouts": summary_timeouts, "measured": True,
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    print(json.dumps({**result, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
