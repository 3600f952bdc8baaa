"""`infersight serve --with-agent`: the sidecar agent as a separate process attached to the server's
ring, as a user would run it beside the engine. The server does not depend on it: if it dies or
never starts answering, requests are still served (the ring drops and counts what nobody reads)."""
from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

log = logging.getLogger("infersight.serve")


@dataclass
class AgentOptions:
    """The agent's listen address and tracing flags (see `infersight agent --help`)."""

    listen: str = "127.0.0.1:9464"
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None
    trace_sample_ratio: float = 1.0
    export_content: bool = False
    otlp_metrics: bool = False
    poll_interval_s: float = 0.05

    def args(self, ring: str, model_name: str) -> list[str]:
        out = ["--ring", ring, "--listen", self.listen, "--model-name", model_name,
               "--poll-interval", str(self.poll_interval_s)]
        if self.otlp_endpoint is not None:
            out += ["--otlp-endpoint", self.otlp_endpoint] if self.otlp_endpoint else ["--otlp-endpoint"]
            out += ["--trace-sample-ratio", str(self.trace_sample_ratio)]
            if self.otlp_protocol:
                out += ["--otlp-protocol", self.otlp_protocol]
            if self.export_content:
                out.append("--export-content")
            if self.otlp_metrics:
                out.append("--otlp-metrics")
        return out


class AgentProcess:
    def __init__(self, ring: str, model_name: str, options: AgentOptions) -> None:
        self.url = f"http://{options.listen}"
        self.proc = subprocess.Popen([sys.executable, "-m", "infersight", "agent", *options.args(ring, model_name)])

    def wait_ready(self, timeout_s: float = 30.0) -> bool:
        """True once /health answers; False (logged, not raised) if it exits or stays silent."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log.warning("the agent exited with code %s; serving without it", self.proc.returncode)
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1.0):  # noqa: S310 (loopback)
                    return True
            except OSError:
                time.sleep(0.1)
        log.warning("the agent did not answer on %s/health within %.0f s; serving anyway", self.url, timeout_s)
        return False

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM: the agent reads the ring one last time and flushes its spans before exiting."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
