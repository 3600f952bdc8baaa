"""Where an alert sends its reader: a dashboard panel (by dashboard uid and panel title) and the
agent's JSON endpoints. The titles are the generated dashboards' own (infersight.dashboards.grafana,
which this room may not import); tests/rules checks each one against the built dashboards, and
each endpoint against the agent's routes, so a renamed panel or route breaks a test, not a page."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Panel:
    dashboard_uid: str
    dashboard_title: str
    title: str


OVERVIEW = ("infersight-overview", "infersight / Overview")
ENGINE = ("infersight-engine", "infersight / Engine internals")
GPU = ("infersight-gpu", "infersight / GPU")
KERNELS = ("infersight-kernels", "infersight / Kernels")

TTFT_PANEL = Panel(*OVERVIEW, "Time to first token")
ITL_PANEL = Panel(*OVERVIEW, "Inter-token latency")
E2E_PANEL = Panel(*OVERVIEW, "End-to-end latency")
PHASE_PANEL = Panel(*OVERVIEW, "Request time by phase")
SLOW_PANEL = Panel(*OVERVIEW, "Slow requests by cause")
PROBE_PANEL = Panel(*OVERVIEW, "Probe ring slots")
PREEMPTION_PANEL = Panel(*ENGINE, "Preemptions and recomputation")
KV_USAGE_PANEL = Panel(*ENGINE, "KV cache usage")
MOE_PANEL = Panel(*ENGINE, "Expert imbalance per layer")
SPEC_PANEL = Panel(*ENGINE, "Acceptance rate by task")
GC_PANEL = Panel(*ENGINE, "Time stalled in garbage collections")
RECORDER_PANEL = Panel(*KERNELS, "Recorder cost against budget")
GPU_TEMPERATURE_PANEL = Panel(*GPU, "GPU temperature")
GPU_POWER_PANEL = Panel(*GPU, "GPU power")
GPU_CLOCKS_PANEL = Panel(*GPU, "GPU clocks")

#: The agent's JSON API (infersight.agent.api.server), as a path on the agent's HTTP port, which is the
#: port Prometheus scrapes: the `instance` label of a target is where these answer.
SUMMARY = "/api/v1/summary"
SLOWEST = "/api/v1/requests?slowest=20"
DIAGNOSIS = "/api/v1/diagnosis"
CAPTURES = "/api/v1/captures"
HEALTH = "/health"
ENDPOINTS = (SUMMARY, SLOWEST, DIAGNOSIS, CAPTURES, HEALTH)


def on_agent(path: str) -> str:
    """The endpoint on the agent that raised the alert (its target's instance)."""
    return f"http://{{{{ $labels.instance }}}}{path}"


def runbook(panels: tuple[Panel, ...], endpoints: str, then: str = "") -> str:
    """One paragraph: the panels to open (grouped by dashboard), the agent endpoints to read, what
    to do next."""
    boards: dict[tuple[str, str], list[str]] = {}
    for p in panels:
        boards.setdefault((p.dashboard_uid, p.dashboard_title), []).append(p.title)
    opened = "; ".join(f"Grafana \"{title}\" (/d/{uid}), panel{'s' if len(names) > 1 else ''} "
                       + ", ".join(f"\"{n}\"" for n in names) for (uid, title), names in boards.items())
    text = f"Open {opened}. Then {endpoints}."
    return text + (" " + then if then else "")
