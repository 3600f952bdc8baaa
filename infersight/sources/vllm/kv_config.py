"""VllmKvConfig: the agent's subscription to vLLM's KV cache events (sources.vllm.kv_events), and its
CLI flag group. Light: zmq is imported only to validate an endpoint that is given."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infersight.commands.numeric_flags import bounded_float
from infersight.config_error import ConfigError

if TYPE_CHECKING:
    from infersight.sources.vllm.kv_events import VllmKVEventsConfig


@dataclass(frozen=True)
class VllmKvConfig:
    """events / replay: the endpoint and replay endpoint as given to vLLM's --kv-events-config
    (tcp://HOST:PORT), and its topic; events None: off. A replay without an answer for
    replay_timeout_s is given up (its holes counted lost): vLLM answers from its engine process,
    which a loaded host can keep off the CPU for seconds. remember_bytes: the KV ledger's table of
    remembered block ids, allocated whole at start (sources.vllm.kv_remembered)."""

    events: str | None = None
    replay: str | None = None
    topic: str = "kv"
    replay_timeout_s: float = 5.0
    remember_bytes: int = 8 << 20

    @property
    def enabled(self) -> bool:
        return bool(self.events)

    def __post_init__(self) -> None:
        if self.replay and not self.events:
            raise ConfigError("--vllm-kv-replay needs --vllm-kv-events")
        if not 0.01 <= self.replay_timeout_s <= 60:
            raise ConfigError(f"--vllm-kv-replay-timeout must be between 0.01 and 60 s, got {self.replay_timeout_s}")
        if self.events:
            try:
                self.subscriber()
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def subscriber(self) -> "VllmKVEventsConfig":
        """The KV event subscriber's config (ValueError when a bound is wrong); needs `events`."""
        from infersight.sources.vllm.kv_events import VllmKVEventsConfig  # zmq only when asked

        assert self.events is not None
        return VllmKVEventsConfig(self.events, self.replay, self.topic, replay_timeout_s=self.replay_timeout_s,
                                  remember_bytes=self.remember_bytes)

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        kv = parser.add_argument_group("vLLM KV cache events (off unless --vllm-kv-events is given)")
        kv.add_argument("--vllm-kv-events", metavar="tcp://HOST:PORT",
                        help="vLLM's --kv-events-config endpoint: the agent binds it (vLLM connects to a "
                             "non-wildcard endpoint), or connects to this host's port for a wildcard one")
        kv.add_argument("--vllm-kv-replay", metavar="tcp://HOST:PORT",
                        help="vLLM's replay_endpoint: sequence gaps are asked for there")
        kv.add_argument("--vllm-kv-topic", default="kv", help="vLLM's KV events topic (default kv)")
        kv.add_argument("--vllm-kv-replay-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="give a replay up after this long without an answer, its gaps counted lost "
                             "(0.01-60 s; default 5: vLLM answers from its engine process, slow on a loaded host)")
        kv.add_argument("--vllm-kv-remember-mib", type=bounded_float(0.0625, 1 << 14), default=8.0, metavar="MIB",
                        help="memory for the block ids the KV ledger remembers (live and evicted hashes, for stable "
                             "ids and recompute detection), allocated at start: 42.7 bytes an id, so the default 8 "
                             "holds 196,608; past it the least recently seen hash is forgotten (counted)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VllmKvConfig:
        return cls(args.vllm_kv_events, args.vllm_kv_replay, args.vllm_kv_topic, args.vllm_kv_replay_timeout,
                   int(args.vllm_kv_remember_mib * (1 << 20)))
