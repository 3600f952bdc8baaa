"""A catalogue entry (MetricSpec), the shared histogram buckets and the PromQL helpers."""
from __future__ import annotations

from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
BLOCK_AGE_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class MetricSpec:
    """name is the family name; counters are exposed as name + "_total"."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] | None = None
    views: dict[str, str] = field(default_factory=dict)  # derived PromQL, by view name
    vllm_name: str | None = None  # the vLLM metric users' dashboards already query, if we have it
    #: Labels the exporter appends from the agent's identity, one value per agent (catalogue.identity:
    #: model_name on the engine's families). The folds never set them; queries and dashboards see them.
    identity_labels: tuple[str, ...] = ()
    #: Counters: the values of the spec's own labels served at 0 before anything is counted (for each
    #: engine where the engine label is on). A series that appears at 1 hides its first event from
    #: increase() and rate(), so an alert on "any preemption" would miss the first one.
    zero_series: tuple[tuple[str, ...], ...] = ()

    @property
    def exposed_labels(self) -> tuple[str, ...]:
        """The labels of every sample as served: the spec's own, then its identity labels."""
        return (*self.labels, *self.identity_labels)

    @property
    def sample(self) -> str:
        """The series name a query uses (counters carry _total)."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def rate(self, by: str = "", window: str = "$__rate_interval") -> str:
        inner = f"rate({self.sample}[{window}])"
        return f"sum by ({by}) ({inner})" if by else f"sum({inner})"

    def quantile(self, q: float, by: str = "", window: str = "$__rate_interval") -> str:
        group = f"le, {by}" if by else "le"
        return f"histogram_quantile({q}, sum by ({group}) (rate({self.name}_bucket[{window}])))"


def latency_views(spec_name: str) -> dict[str, str]:
    return {q: f"histogram_quantile({v}, sum by (le) (rate({spec_name}_bucket[$__rate_interval])))"
            for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def ratio(num: str, den: str) -> str:
    return f"sum(rate({num}[$__rate_interval])) / clamp_min(sum(rate({den}[$__rate_interval])), 1e-9)"


P = "infersight_"

