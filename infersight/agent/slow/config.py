"""SlowRequestConfig: which finished requests are slow (correlate.slow_rule), and its CLI flag group."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError


@dataclass(frozen=True)
class SlowRequestConfig:
    """A request is slow above the `quantile` of the e2e of the last `window` finished requests (once
    min_requests_for_p99 have finished; at most that share flagged), or, when any slo_*_s is set, over
    those objectives (seconds) instead."""

    quantile: float = 0.99
    window: int = 1000
    min_requests_for_p99: int = 20
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    slo_e2e_s: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ConfigError(f"--slow-quantile must be in (0, 1), got {self.quantile}")
        if self.window < 1:
            raise ConfigError(f"--slow-window must be >= 1, got {self.window}")
        if self.min_requests_for_p99 < 1:
            raise ConfigError(f"min_requests_for_p99 must be >= 1, got {self.min_requests_for_p99}")
        for flag, value in (("--slo-ttft-s", self.slo_ttft_s), ("--slo-itl-s", self.slo_itl_s),
                            ("--slo-e2e-s", self.slo_e2e_s)):
            if value is not None and not value > 0:
                raise ConfigError(f"{flag} must be > 0 s, got {value}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        slow = parser.add_argument_group("slow requests (above a rolling quantile of e2e, or over an SLO when one "
                                         "is given)")
        slow.add_argument("--slow-quantile", type=float, default=0.99, metavar="Q",
                          help="a request is slow above this quantile of recent e2e (default 0.99: at most 1%% "
                               "flagged)")
        slow.add_argument("--slow-window", type=int, default=1000, metavar="N",
                          help="the quantile is over the last N finished requests (default 1000)")
        slow.add_argument("--slo-ttft-s", type=float, metavar="SECONDS",
                          help="slow: TTFT over this (replaces the quantile)")
        slow.add_argument("--slo-itl-s", type=float, metavar="SECONDS",
                          help="slow: mean inter-token latency over this (replaces the quantile)")
        slow.add_argument("--slo-e2e-s", type=float, metavar="SECONDS",
                          help="slow: e2e over this (replaces the quantile)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SlowRequestConfig:
        return cls(quantile=args.slow_quantile, window=args.slow_window, slo_ttft_s=args.slo_ttft_s,
                   slo_itl_s=args.slo_itl_s, slo_e2e_s=args.slo_e2e_s)
