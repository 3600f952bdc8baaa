"""RetentionConfig: what the agent keeps of finished requests, and its CLI flag."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.commands.numeric_flags import bounded_float
from infersight.config_error import ConfigError


@dataclass(frozen=True)
class RetentionConfig:
    """rows_bytes: finished requests' rows kept for the summary, /api/v1/requests and the flight
    recorder, at most this many bytes of row data (agent.rows.row_window.frame_bytes), the oldest going
    first; ~0.5 KB a row: the default keeps ~10,000 requests, the count the agent kept before its
    budget was in bytes (5 MiB, not 8: the agent at ~13 requests/s levelled at 155 MB with 8, over
    its 150 MB goal; BENCHMARKS.md). requests: prefix-cache groups and capture kernel times kept (counts)."""

    rows_bytes: int = 5 << 20
    requests: int = 10_000

    def __post_init__(self) -> None:
        if self.rows_bytes < 1:
            raise ConfigError(f"--retention-mib must be > 0, got {self.rows_bytes} bytes")
        if self.requests < 1:
            raise ConfigError(f"retained requests must be >= 1, got {self.requests}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--retention-mib", type=bounded_float(0.0625, 1 << 16), default=5.0, metavar="MIB",
                            help="finished requests' rows kept for the summary and /api/v1/requests, in MiB of "
                                 "row data (default 5: ~10,000 requests); the oldest go first")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RetentionConfig:
        return cls(rows_bytes=int(args.retention_mib * (1 << 20)))
