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
    # issue 33's soak: 30 minutes with the vLLM KV-event stream, the OTLP receiver and the recorder on
    python benchmarks/agent_memory_soak.py --rate 13 --duration 1800 --kv-events --otlp --agent-arg=--flight-recorder
    # where the heap grows, by allocation site (tracemalloc in the agent: run it slower, e.g. --rate 8)
    python benchmarks/agent_memory_soak.py --rate 8 --duration 1500 --kv-events --otlp --window-s 300 \
        --traced-agent growth.txt
    # the agent's CPU at an H200 `serve`'s rate (48 in a batch, 96 tokens, 115 requests/s), exporting spans
    python benchmarks/agent_memory_soak.py --rate 115 --tokens 96 --wave 48 --duration 30 --sample-s 5 \
        --window-s 20 --otlp-export

--kv-events: a publisher written byte for byte as vLLM 0.32's (tests/vllm/kv_fake_vllm.py) connects to
the agent's --vllm-kv-events endpoint and, per wave, stores --kv-blocks new blocks per request and
removes those older than --kv-live blocks (a cache at steady occupancy). --otlp: the OpenTelemetry
SDK's OTLP/HTTP exporter, as vLLM's --otlp-traces-endpoint uses it, sends one llm_request span per
request to the agent's --otlp-receiver; their ids are vLLM-style and join no ring request, so every
span waits --otlp-join-wait and leaves alone: the receiver's bound is what is soaked. --otlp-export: only
the agent's own export, to a local sink that answers every request. Every sample also
reads the agent's CPU time (/proc/PID/stat: utime + stime over the sample, as a share of one core) and,
where the agent exposes it, its poll time over the sample (infersight_agent_poll_duration_seconds: the
mean, and the p99 from its buckets). The summary compares the first and the last --window-s (default
10 minutes): poll time p50 / p99, median CPU, and the RSS slope over each.

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
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infersight.bench.agent import stop_agent, synthetic_workload  # noqa: E402
from infersight.bench.serving.otlp_sink import OtlpSink  # noqa: E402
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


def cpu_s(pid: int) -> float:
    """utime + stime of a process (Linux /proc/PID/stat fields 14 and 15), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


POLL = "infersight_agent_poll_duration_seconds"


@dataclass(frozen=True)
class PollHistogram:
    """The agent's poll-duration histogram at one scrape: sum (s), count, cumulative bucket counts by
    upper bound (the last +Inf). Empty (count nan) from an agent without it."""

    total_s: float
    count: float
    buckets: tuple[tuple[float, float], ...]

    def minus(self, earlier: "PollHistogram") -> "PollHistogram":
        """The polls between two scrapes of one agent (counters only grow)."""
        return PollHistogram(self.total_s - earlier.total_s, self.count - earlier.count,
                             tuple((le, n - m) for (le, n), (_, m) in zip(self.buckets, earlier.buckets)))

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear inside the bucket the rank falls in, the first bucket
        from 0; the highest finite bound when the rank is in +Inf. Seconds; nan without polls."""
        if not self.buckets or not self.count > 0:
            return float("nan")
        rank, lower, below = q * self.buckets[-1][1], 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if le == float("inf"):
                    return lower
                return lower + (le - lower) * ((rank - below) / (cum - below) if cum > below else 1.0)
            lower, below = le, cum
        return lower


def poll_histogram(url: str) -> PollHistogram:
    """The poll-duration histogram from the agent's /metrics."""
    total = count = float("nan")
    buckets: list[tuple[float, float]] = []
    for line in urllib.request.urlopen(url + "/metrics", timeout=20).read().decode().splitlines():
        if line.startswith(POLL + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(POLL + "_count"):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(POLL + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))  # float("+Inf") is inf
    return PollHistogram(total, count, tuple(sorted(buckets)))


#: Counters read from the agent's /metrics at the end: what it took in of each stream.
COUNTED = ("infersight_vllm_kv_events_total", "infersight_otlp_receiver_spans_total",
           "infersight_otlp_receiver_spans_rejected_total", "infersight_recorder_windows_total",
           "infersight_agent_poll_failures_total")


def counters(url: str) -> dict[str, float]:
    """The COUNTED counters from /metrics, summed over their labels."""
    out = dict.fromkeys(COUNTED, 0.0)
    for line in urllib.request.urlopen(url + "/metrics", timeout=20).read().decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


class KvPublisher:
    """vLLM's KV-event PUB (connects to the agent's bound SUB), blocks stored per request and evicted
    once older than `live` blocks."""

    def __init__(self, endpoint: str, blocks: int, live: int) -> None:
        import zmq

        sys.path.insert(0, str(REPO / "tests" / "vllm"))
        import kv_fake_vllm as wire  # vLLM 0.32's structs, written here field for field

        self.wire, self.blocks, self.live = wire, blocks, live
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(endpoint)
        self.seq = self.next_block = self.oldest = 0

    def wave(self, requests: int) -> None:
        w = self.wire
        new = list(range(self.next_block, self.next_block + requests * self.blocks))
        self.next_block += len(new)
        events = [w.stored(*new[i:i + self.blocks]) for i in range(0, len(new), self.blocks)]
        if self.next_block - self.oldest > self.live:
            gone = list(range(self.oldest, self.next_block - self.live))
            self.oldest = self.next_block - self.live
            events.append(w.removed(*gone))
        payload = w.msgspec.msgpack.encode(w.KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))
        self.pub.send_multipart((b"kv", self.seq.to_bytes(8, "big"), payload))
        self.seq += 1

    def close(self) -> None:
        self.pub.close(linger=0)
        self.ctx.destroy(linger=0)


class SpanSender:
    """The OTel SDK as vLLM configures it: one llm_request span per request over OTLP/HTTP."""

    def __init__(self, endpoint: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("vllm.v1.engine.output_processor")

    def wave(self, first: int, requests: int, tokens: int) -> None:
        for rid in range(first, first + requests):
            span = self.tracer.start_span("llm_request", attributes={
                "gen_ai.request.id": f"cmpl-soak-{rid}-0", "gen_ai.usage.prompt_tokens": 40,
                "gen_ai.usage.completion_tokens": tokens, "gen_ai.request.max_tokens": tokens})
            span.end()

    def close(self) -> None:
        self.provider.shutdown()


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


def _median(values: list[float]) -> float:
    v = sorted(x for x in values if x == x)
    return round(v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2, 2) if v else float("nan")


def windows(samples: list[dict], hists: list[PollHistogram], window_s: float) -> dict[str, object]:
    """The first and the last window_s of the run side by side: poll time p50 / p99 (from the histogram's
    buckets, so within a bucket's width: 25-50 ms is one bucket) and mean, median CPU share, and the
    least-squares slope of RSS and of RssAnon over each window."""
    end = samples[-1]["t_s"]
    out: dict[str, object] = {}
    for name, lo, hi in (("first", 0.0, window_s), ("last", end - window_s, end)):
        idx = [i for i, s in enumerate(samples) if lo <= s["t_s"] <= hi]
        if len(idx) < 2:
            continue
        polls = hists[idx[-1]].minus(hists[idx[0]])
        part = [samples[i] for i in idx]
        out.update({
            f"poll_p50_ms_{name}": round(1e3 * polls.quantile(0.5), 2),
            f"poll_p99_ms_{name}": round(1e3 * polls.quantile(0.99), 2),
            f"poll_mean_ms_{name}": round(1e3 * polls.total_s / polls.count, 2) if polls.count > 0 else float("nan"),
            f"polls_{name}": polls.count,
            f"cpu_pct_{name}": _median([s["cpu_pct"] for s in part[1:]]),  # each sample's CPU is over the sample before
            f"rss_slope_{name}_mb_per_min": round(_slope(part, "rss"), 3),
            f"anon_slope_{name}_mb_per_min": round(_slope(part, "anon"), 3),
            f"rss_{name}_window_mb": f"{part[0]['rss']:.1f} -> {part[-1]['rss']:.1f}"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=13.0, help="requests per second (default 13, the issue's)")
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of load")
    ap.add_argument("--tokens", type=int, default=48, help="output tokens per request (one step each)")
    ap.add_argument("--wave", type=int, default=4, help="requests per wave (decoded together)")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples")
    ap.add_argument("--agent-arg", action="append", default=[], help="extra `infersight agent` argument (repeatable)")
    ap.add_argument("--kv-events", action="store_true", help="also a vLLM KV-event stream into the agent")
    ap.add_argument("--kv-blocks", type=int, default=4, help="KV blocks stored per request (--kv-events)")
    ap.add_argument("--kv-live", type=int, default=4096, help="blocks held before the oldest are removed (--kv-events)")
    ap.add_argument("--otlp", action="store_true", help="also vLLM-style spans into the agent's OTLP receiver")
    ap.add_argument("--otlp-export", action="store_true",
                    help="the agent exports its request spans to a local OTLP sink (no receiver, no spans sent in)")
    ap.add_argument("--window-s", type=float, default=600.0,
                    help="the first and the last this many seconds are compared (poll time, CPU, RSS slope)")
    ap.add_argument("--traced-agent", type=Path, metavar="FILE",
                    help="run the agent under benchmarks/agent_traced.py (tracemalloc) and write its growth report to "
                         "FILE (first snapshot after --window-s, then every --window-s / 2)")
    args = ap.parse_args()

    name = f"infersight-memsoak-{os.getpid()}"
    probe = ProbeObserver(ProbeConfig(ring_name=name, nvtx=False))  # the default ring size
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    extra: list[str] = []
    kv_endpoint = f"tcp://127.0.0.1:{free_port()}"
    otlp_port = free_port()
    if args.kv_events:
        extra += ["--vllm-kv-events", kv_endpoint]
    sink = OtlpSink() if args.otlp or args.otlp_export else None
    if sink is not None:
        extra += ["--otlp-endpoint", sink.url]
    if args.otlp:
        extra += ["--otlp-receiver", f"127.0.0.1:{otlp_port}"]
    launcher = ["-m", "infersight"]
    if args.traced_agent:
        launcher = [str(REPO / "benchmarks" / "agent_traced.py"), "--out", str(args.traced_agent.resolve()),
                    "--first-s", str(args.window_s), "--every-s", str(args.window_s / 2), "--"]
    cmd = [sys.executable, *launcher, "agent", "--ring", name, "--listen", f"127.0.0.1:{port}",
           "--gpu-source", "none", *extra, *args.agent_arg]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    samples: list[dict] = []
    hists: list[PollHistogram] = []  # the poll histogram at each sample (cumulative)
    kv: KvPublisher | None = None
    taken: dict[str, float] = {}
    spans: SpanSender | None = None
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
        kv = KvPublisher(kv_endpoint, args.kv_blocks, args.kv_live) if args.kv_events else None
        spans = SpanSender(f"http://127.0.0.1:{otlp_port}/v1/traces") if args.otlp else None
        print(f"{'t_s':>6} {'requests':>9} {'rss_mb':>7} {'anon_mb':>8} {'shmem_mb':>8} {'kept':>6} {'kept_mib':>8} "
              f"{'cpu_%':>6} {'poll_ms':>8} {'p99_ms':>7}", flush=True)
        start = time.monotonic()
        last_cpu, last_t, last_poll = cpu_s(proc.pid), start, poll_histogram(url)
        next_sample, rid, step, summary_timeouts = start, 0, 0, 0
        wave_s = args.wave / args.rate
        while True:
            now = time.monotonic()
            if now >= next_sample:
                try:  # an agent that falls behind may not answer in time: a sample without its counts
                    kept = _get(url + "/api/v1/summary").get("retention", {})
                except OSError:
                    kept, summary_timeouts = {"requests": -1}, summary_timeouts + 1
                cpu, poll = cpu_s(proc.pid), poll_histogram(url)
                polls = poll.minus(last_poll)
                sample = {"t_s": round(now - start, 1), "requests": rid, **memory_mb(proc.pid),
                          "kept": kept.get("requests", -1), "kept_mib": kept.get("bytes", 0) / 2**20,
                          "cpu_pct": 100 * (cpu - last_cpu) / max(now - last_t, 1e-9),
                          "poll_ms": 1e3 * polls.total_s / polls.count if polls.count > 0 else float("nan"),
                          "poll_p99_ms": 1e3 * polls.quantile(0.99)}
                last_cpu, last_t, last_poll = cpu, now, poll
                samples.append(sample)
                hists.append(poll)
                print(f"{sample['t_s']:>6.0f} {rid:>9} {sample['rss']:>7.1f} {sample['anon']:>8.1f} "
                      f"{sample['shmem']:>8.1f} {sample['kept']:>6} {sample['kept_mib']:>8.2f} "
                      f"{sample['cpu_pct']:>6.1f} {sample['poll_ms']:>8.2f} {sample['poll_p99_ms']:>7.1f}", flush=True)
                next_sample += args.sample_s
            if now - start >= args.duration:
                taken = counters(url)
                break
            step = synthetic_workload(probe, args.wave, args.tokens, first_id=rid, first_step=step)
            if kv is not None:
                kv.wave(args.wave)
            if spans is not None:
                spans.wave(rid, args.wave, args.tokens)
            rid += args.wave
            time.sleep(max(0.0, start + rid / args.rate - time.monotonic()))
    finally:
        for part in (kv, spans, sink):
            if part is not None:
                part.close()
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
        # CPU and poll time, medians of the first and the second half (after warm-up: the first sample out)
        "cpu_pct_first_half": _median([s["cpu_pct"] for s in samples[1:] if s not in half]),
        "cpu_pct_second_half": _median([s["cpu_pct"] for s in half]),
        "poll_ms_first_half": _median([s["poll_ms"] for s in samples[1:] if s not in half]),
        "poll_ms_second_half": _median([s["poll_ms"] for s in half]),
        **windows(samples, hists, args.window_s),
        "kv_events": args.kv_events, "otlp": args.otlp,
        "kv_batches_sent": kv.seq if kv else 0, "spans_sent": rid if spans else 0,
        **{k.removeprefix("infersight_"): v for k, v in taken.items()},
        "otlp_sink_exports": sink.exports if sink else 0, "otlp_sink_bytes": sink.bytes if sink else 0,
        "summary_timeouts": summary_timeouts, "measured": True,
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    print(json.dumps({**result, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
