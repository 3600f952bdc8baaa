"""VllmHttpConfig: the agent beside an unmodified vLLM server, through its HTTP endpoints
(sources.vllm.scraper, sources.vllm.profiler), and its CLI flag group. AgentConfig.vllm_server holds one.
Not infersight.vllm.launch.VllmServerConfig, which starts a vLLM server."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError


@dataclass(frozen=True)
class VllmHttpConfig:
    """url: vLLM's base URL (None: off); its /metrics is scraped every metrics_interval_s and served
    under our names. With profiler_dir (its torch_profiler_dir as this host sees it) captures go
    through /start_profile and /stop_profile; capture_wait_s bounds both the wait for the steps and
    the wait for the trace file."""

    url: str | None = None
    metrics_interval_s: float = 2.0
    profiler_dir: str | None = None
    capture_wait_s: float = 60.0

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--vllm-url must be an http(s) base URL such as http://127.0.0.1:8000, got "
                              f"{self.url!r}")
        if not 0.1 <= self.metrics_interval_s <= 300:
            raise ConfigError(f"--vllm-metrics-interval must be between 0.1 and 300 s, got {self.metrics_interval_s}")
        if self.profiler_dir is not None and not self.url:
            raise ConfigError("--vllm-profiler-dir needs --vllm-url (the server whose profiler writes there)")
        if not 1 <= self.capture_wait_s <= 3600:
            raise ConfigError(f"the vLLM capture wait must be between 1 and 3600 s, got {self.capture_wait_s}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        vllm = parser.add_argument_group("an unmodified vLLM server (off unless --vllm-url is given)")
        vllm.add_argument("--vllm-url", metavar="URL",
                          help="vLLM's base URL (http://127.0.0.1:8000): its /metrics is scraped and served under "
                               "infersight names; captures use its /start_profile and /stop_profile")
        vllm.add_argument("--vllm-metrics-interval", type=float, default=2.0, metavar="SECONDS",
                          help="seconds between scrapes of vLLM's /metrics (default 2)")
        vllm.add_argument("--vllm-profiler-dir", metavar="DIR",
                          help="vLLM's torch_profiler_dir: captures (infersight capture --steps N) profile vLLM's "
                               "next N steps and analyse the worker's trace from DIR")
        vllm.add_argument("--vllm-capture-wait", type=float, default=60.0, metavar="SECONDS",
                          help="how long a vLLM capture waits for its steps, and then for the trace (default 60)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VllmHttpConfig:
        return cls(args.vllm_url, args.vllm_metrics_interval, args.vllm_profiler_dir, args.vllm_capture_wait)
