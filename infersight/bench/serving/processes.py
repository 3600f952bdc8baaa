"""The processes `bench serving` starts and reads from outside, as a user would: `infersight serve`, an
`infersight agent` per arm, their health, and the recorder's figures from the agent's /metrics."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

from infersight.bench.serving.otlp_sink import OtlpSink
from infersight.bench.serving.config import ServingBenchConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessFailed(RuntimeError):
    """A process the bench started exited or never answered; the message ends with its log's last line."""


def last_line(log_path: Path) -> str:
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def wait_health(url: str, proc: subprocess.Popen, what: str, log_path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            # The process's own last word, so the bench's one line says why (the run that lost the
            # H200 full arm printed only an exit code).
            raise ProcessFailed(f"{what} exited with code {proc.returncode}: {last_line(log_path)} (log: {log_path})")
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()  # noqa: S310 (loopback)
            return
        except OSError:
            time.sleep(0.2)
    raise ProcessFailed(f"{what} did not answer on /health within {timeout_s:.0f} s (log: {log_path})")


def start_serve(config: ServingBenchConfig, ring: str, port: int, log: IO[str]) -> subprocess.Popen:
    """`infersight serve` on 127.0.0.1:port with the bench's model, device, dtype, seed and serve_args."""
    return subprocess.Popen([sys.executable, "-m", "infersight", "serve", "--listen", f"127.0.0.1:{port}",
                             "--model", config.model, "--device", config.device, "--dtype", config.dtype,
                             "--ring", ring, "--seed", str(config.seed), *config.serve_args],
                            stdout=log, stderr=subprocess.STDOUT)


def agent_cmd(arm: str, ring: str, port: int, out_dir: Path, sink: OtlpSink | None) -> list[str]:
    cmd = [sys.executable, "-m", "infersight", "agent", "--ring", ring, "--listen", f"127.0.0.1:{port}",
           "--gpu-source", "auto" if arm == "full" else "none"]
    if arm in ("agent_recorder", "full"):
        # One directory per arm: each phase's fresh agent starts its budget from the window costs the arm's
        # earlier phases measured (as a restarted agent does), not from the guess (which takes no window
        # in a short phase). The first phase of the arm has only the guess.
        cmd += ["--flight-recorder", "--recorder-dir", str(out_dir / f"recorder-{arm}")]
    if arm == "full" and sink is not None:
        cmd += ["--otlp-endpoint", sink.url, "--parquet-dir", str(out_dir / "parquet")]
    return cmd


#: The agent's exposition names read here (exporters.catalogue's RECORDER_COST_RATIO, RECORDER_WINDOWS,
#: RECORDER_COST, RECORDER_ENGINE and PROBE_DROPPED: bench reads the agent from outside, as a client does,
#: and imports no exporter).
RECORDER_COST_SAMPLE, RECORDER_WINDOWS_SAMPLE = "infersight_recorder_cost_ratio", "infersight_recorder_windows_total"
RECORDER_COST_S_SAMPLE, RECORDER_ENGINE_S_SAMPLE = ("infersight_recorder_cost_seconds_total",
                                                    "infersight_recorder_engine_seconds_total")
PROBE_DROPPED_SAMPLE = "infersight_probe_events_dropped_total"


def agent_figures(url: str) -> dict[str, float]:
    """From the agent's /metrics: the recorder's own amortised cost figure (cost_ratio), the windows it
    measured (analysed), the measured cost and engine seconds behind the ratio (summed over their labels),
    and the probe slots the engine dropped on a full ring; NaN where the agent did not say."""
    out = dict.fromkeys(("cost_ratio", "windows", "cost_s", "engine_s", "ring_dropped"), float("nan"))
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()  # noqa: S310 (loopback)
    except OSError:
        return out
    sums = {RECORDER_COST_S_SAMPLE: "cost_s", RECORDER_ENGINE_S_SAMPLE: "engine_s", PROBE_DROPPED_SAMPLE: "ring_dropped"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == RECORDER_COST_SAMPLE:
                out["cost_ratio"] = float(sample.value)
            elif sample.name == RECORDER_WINDOWS_SAMPLE and sample.labels.get("outcome") == "analysed":
                out["windows"] = float(sample.value)
            elif sample.name in sums:
                key = sums[sample.name]
                out[key] = (0.0 if out[key] != out[key] else out[key]) + float(sample.value)
    return out
