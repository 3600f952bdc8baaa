"""The fleet view's one config object, validated when built (ValueError: the CLI prints one line)."""
from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

#: A PromQL duration as `--since` takes it: one number and unit (15m, 2h, 90s, 1d).
_DURATION = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class FleetConfig:
    """prometheus_url: the Prometheus (or a PromQL-compatible API: Thanos Query, Mimir) holding every
    node's series. since: the window each rate, quantile and increase covers, ending now.
    node_label: the label that names a node; an agent-mode Prometheus per node sets it as an
    external label (`external_labels: {node: ...}`), the way an SRE tells nodes apart in one store.
    model_label: the label naming the model (a scrape config's target label, as the rules' service
    labels expect). agent_scheme: how the agent's `instance` (HOST:PORT of its /metrics, which also
    serves its JSON API) is reached for the slowest-requests link. slowest: N in that link.
    top_experts: how many (layer, expert) pairs the hottest-experts table lists.
    timeout_s: one query's HTTP timeout."""

    prometheus_url: str
    since: str = "15m"
    node_label: str = "node"
    model_label: str = "model_name"
    agent_scheme: str = "http"
    slowest: int = 20
    top_experts: int = 10
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        url = urllib.parse.urlsplit(self.prometheus_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(f"--prometheus-url must be an http(s) URL such as http://127.0.0.1:9090, "
                             f"got {self.prometheus_url[:80]!r}")
        if not _DURATION.match(self.since):
            raise ValueError(f"--since must be a Prometheus duration such as 15m, 2h or 1d, got {self.since[:40]!r}")
        for name in ("node_label", "model_label"):
            if not _LABEL.match(getattr(self, name)):
                raise ValueError(f"--{name.replace('_', '-')} must be a label name, got {getattr(self, name)[:40]!r}")
        if self.node_label == self.model_label:
            raise ValueError("--node-label and --model-label must differ")
        if self.agent_scheme not in ("http", "https"):
            raise ValueError(f"--agent-scheme must be http or https, got {self.agent_scheme!r}")
        if not 1 <= self.slowest <= 1000 or not 1 <= self.top_experts <= 1000:
            raise ValueError("--slowest and --top-experts must be in 1..1000")
        if not 0 < self.timeout_s <= 300:
            raise ValueError(f"--timeout-s must be in (0, 300], got {self.timeout_s}")

    @property
    def since_s(self) -> int:
        m = _DURATION.match(self.since)
        assert m is not None  # checked in __post_init__
        return int(m.group(1)) * _SECONDS[m.group(2)]
