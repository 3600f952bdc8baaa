"""Alerts on the observer itself: the agent's scrape target down or gone, an agent that reads no
probe ring or fewer rings than before, a ring whose engine died without closing it, and probe
events dropped (ring full) or lost (an agent died holding them). Without these, every other alert
can go quiet for the wrong reason."""
from __future__ import annotations

from infersight.exporters import catalogue as C
from infersight.exporters.rules import runbook as R
from infersight.exporters.rules.config import RulesConfig
from infersight.exporters.rules.expressions import base_name, by, record_name
from infersight.exporters.rules.rule import Alert

AT = "{{ $labels.instance }}"
#: Ring changes are compared across this much time.
RING_LOOKBACK = "10m"


def _up(config: RulesConfig) -> str:
    return f"up{{{config.agent_selector}}}"


def agent_down(config: RulesConfig) -> Alert:
    return Alert(
        alert="InfersightAgentDown", severity="critical", for_="5m",
        expr=f"avg_over_time({_up(config)}[10m]) < 0.5",
        summary=f"{AT}: the infersight agent answers {{{{ $value | humanizePercentage }}}} of scrapes",
        description=(f"Only {{{{ $value | humanizePercentage }}}} of Prometheus' scrapes of the agent at {AT} (job "
                     f"{{{{ $labels.job }}}}) succeeded over 10 minutes, for 5 minutes. Its engine's metrics, and the "
                     f"alerts on them, are missing meanwhile."),
        runbook=R.runbook((R.PROBE_PANEL,), f"open {R.on_agent(R.HEALTH)}; if it does not answer, read the agent "
                                            "container's log and restarts (kubectl describe pod)",
                          "A sidecar restarted by its probe comes back on its own and takes the ring's lease over."))


def agent_absent(config: RulesConfig) -> Alert:
    return Alert(
        alert="InfersightAgentAbsent", severity="critical", for_="15m", has_value=False,
        expr=f"absent({_up(config)})",
        summary="No infersight agent is scraped",
        description=(f"Prometheus has had no scrape target matching {{{config.agent_selector}}} for 15 minutes: the "
                     f"pods are gone, or the PodMonitor / scrape config no longer selects them. Every infersight "
                     f"alert is silent meanwhile."),
        runbook=R.runbook((R.PROBE_PANEL,), f"check Prometheus' /targets page for the job, then {R.HEALTH} on a pod "
                                            "(kubectl port-forward)",
                          "If the selector changed, regenerate the rules with `infersight rules --agent-selector`."))


def no_probe_ring(config: RulesConfig) -> Alert:
    t = by(config.target_labels)
    return Alert(
        alert="InfersightNoProbeRing", severity="warning", for_="15m", has_value=False,
        expr=(f"max {t} ({_up(config)}) == 1\nunless\n"
              f"count {t} ({C.PROBE_EVENTS.sample})"),
        summary=f"{AT}: the agent is up but reads no probe ring",
        description=(f"The agent at {AT} has answered scrapes for 15 minutes without reading any probe ring: the "
                     f"engine is not running with probes on, has not started, shares no /dev/shm with the agent, or "
                     f"its ring is held by another agent."),
        runbook=R.runbook((R.PROBE_PANEL,), f"read {R.on_agent(R.HEALTH)} (its \"rings\": none) and "
                                            f"{R.on_agent(R.SUMMARY)} (\"rings\", \"sources\")",
                          "Check the engine container's log and that both containers mount the same emptyDir at "
                          "/dev/shm."))


def probe_ring_gone(config: RulesConfig) -> Alert:
    t = by(config.target_labels)
    return Alert(
        alert="InfersightProbeRingGone", severity="warning",
        expr=(f"count {t} ({C.PROBE_EVENTS.sample} offset {RING_LOOKBACK})\n>\n"
              f"(\n  count {t} ({C.PROBE_EVENTS.sample})\nor\n  (max {t} ({_up(config)}) == 1) * 0\n)"),
        summary=f"{AT}: fewer probe rings than {RING_LOOKBACK} ago",
        description=(f"The agent at {AT} read {{{{ $value }}}} probe ring(s) {RING_LOOKBACK} ago and reads fewer now: "
                     f"an engine exited without a successor, or a ring became unreadable and was detached. (An "
                     f"engine restart that brings a new ring keeps the count and does not fire.)"),
        runbook=R.runbook((R.PROBE_PANEL,), f"read {R.on_agent(R.HEALTH)} (the rings read now) and "
                                            f"{R.on_agent(R.SUMMARY)} (\"rings\": each ring's counts)",
                          "Check whether the engine container restarted or crashed."))


def probe_ring_writer_died(config: RulesConfig) -> Alert:
    t = by(config.target_labels)
    return Alert(
        alert="InfersightEngineDied", severity="warning",
        expr=f"sum {t} (increase({C.PROBE_RINGS_DEAD.sample}[15m])) > 0",
        summary=f"{AT}: {{{{ $value | printf \"%.4g\" }}}} engine(s) died without closing their probe ring",
        description=(f"The agent at {AT} found {{{{ $value | printf \"%.4g\" }}}} probe ring(s) in the last 15 minutes "
                     f"whose engine died without closing them (killed, crashed, OOM-killed: its heartbeat stopped "
                     f"for 5 beats, or its pid exited). Requests in flight then got no answer. A restarted engine "
                     f"writes a new ring, so InfersightProbeRingGone stays silent; this one does not."),
        runbook=R.runbook((R.PROBE_PANEL,), f"read {R.on_agent(R.HEALTH)} (the rings read now) and the engine "
                                            "container's previous log (kubectl logs --previous -c engine)",
                          "Check the engine container's last state (kubectl describe pod: OOMKilled, exit code)."))


def probe_events_dropped(config: RulesConfig) -> Alert:
    rate = record_name(config.target_labels + ("ring",), base_name(C.PROBE_DROPPED), "rate5m")
    return Alert(
        alert="InfersightProbeEventsDropped", severity="warning", for_="5m",
        expr=f"{rate} > 0",
        summary=f"{AT}: probe ring {{{{ $labels.ring }}}} drops {{{{ $value | printf \"%.4g\" }}}} slots/s",
        description=(f"The engine dropped {{{{ $value | printf \"%.4g\" }}}} probe slots per second on ring "
                     f"{{{{ $labels.ring }}}} (read by {AT}) over 5 minutes, for 5 minutes: the ring was full because "
                     f"the agent reads slower than the engine writes. Requests, KV and MoE figures undercount "
                     f"meanwhile."),
        runbook=R.runbook((R.PROBE_PANEL,), f"read {R.on_agent(R.SUMMARY)} (\"dropped_events\", \"rings\") and the "
                                            "agent's CPU in its container metrics",
                          "Give the agent more CPU or the ring more slots (the engine's ring size)."))


def probe_events_lost(config: RulesConfig) -> Alert:
    keep = config.target_labels + ("ring",)
    return Alert(
        alert="InfersightProbeEventsLost", severity="warning",
        expr=f"sum {by(keep)} (increase({C.PROBE_LOST.sample}[15m])) > 0",
        summary=f"{AT}: {{{{ $value | printf \"%.4g\" }}}} probe events lost on ring {{{{ $labels.ring }}}}",
        description=(f"{{{{ $value | printf \"%.4g\" }}}} probe events were taken off ring {{{{ $labels.ring }}}} in the "
                     f"last 15 minutes by an agent that died before folding them in; its successor at {AT} counted "
                     f"them. Requests of that moment are missing from the figures."),
        runbook=R.runbook((R.PROBE_PANEL,), f"read {R.on_agent(R.SUMMARY)} (\"lost_events\", \"rings\") and the "
                                            "agent container's previous log (kubectl logs --previous)",
                          "Find why the agent died (OOM kill, liveness probe) before it happens again."))


def agent_alerts(config: RulesConfig) -> list[Alert]:
    return [agent_down(config), agent_absent(config), no_probe_ring(config), probe_ring_gone(config),
            probe_ring_writer_died(config), probe_events_dropped(config), probe_events_lost(config)]
