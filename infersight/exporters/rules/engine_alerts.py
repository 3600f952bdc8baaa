"""Alerts on what the engine does, per agent (one agent reads one engine): a preemption storm, KV
cache pressure, MoE expert imbalance, speculation acceptance collapsing for a task, the flight
recorder costing more than its budget, and the engine's process stalled in garbage collection."""
from __future__ import annotations

from infersight.exporters import catalogue as C
from infersight.exporters.rules import runbook as R
from infersight.exporters.rules.config import RulesConfig
from infersight.exporters.rules.expressions import base_name, by, record_name
from infersight.exporters.rules.recording import spec_accept_ratio
from infersight.exporters.rules.rule import Alert

#: The imbalance statistic the agent exports under moe_layer_imbalance's `stat` label
#: (exporters.prometheus) that /api/v1/diagnosis also judges.
MAX_OVER_MEAN = "max_over_mean"
AT = "{{ $labels.instance }}"


def preemption_storm(config: RulesConfig) -> Alert:
    per_step = record_name(config.target_labels, f"{base_name(C.PREEMPTIONS)}_per_{base_name(C.STEPS).removeprefix(C.P)}",
                           "ratio_rate5m")
    return Alert(
        alert="InfersightPreemptionStorm", severity="warning", for_="5m",
        expr=f"{per_step} > {config.preemptions_per_step:g}",
        summary=f"{AT}: preemption storm ({{{{ $value | printf \"%.3g\" }}}} preemptions per engine step)",
        description=(f"The engine behind {AT} preempted {{{{ $value | printf \"%.3g\" }}}} requests per step over "
                     f"5 minutes, for 5 minutes (storm above {config.preemptions_per_step:g}, the flight recorder's "
                     f"trigger rate). Preempted requests lose their KV and stall or recompute it."),
        runbook=R.runbook((R.PREEMPTION_PANEL, R.KV_USAGE_PANEL),
                          f"read {R.on_agent(R.SUMMARY)} (its \"kv\" section: preemptions, recomputed tokens) and "
                          f"{R.on_agent(R.CAPTURES)} (the capture the preemption_storm trigger took)",
                          "Give the KV cache more blocks (GPU memory utilisation, a smaller max batch), or lower "
                          "the concurrency the engine admits."))


def kv_pressure(config: RulesConfig) -> Alert:
    t = by(config.target_labels)
    return Alert(
        alert="InfersightKVCachePressure", severity="warning", for_="10m",
        expr=(f"max {t} ({C.KV_USAGE.sample}) > {config.kv_usage_ratio:g}\n"
              f"and\nsum {t} ({C.REQUESTS_WAITING.sample}) > 0"),
        summary=f"{AT}: KV cache {{{{ $value | humanizePercentage }}}} full with requests waiting",
        description=(f"The engine behind {AT} has had {{{{ $value | humanizePercentage }}}} of its KV blocks in use "
                     f"(alert above {100 * config.kv_usage_ratio:g}%) with requests waiting to be scheduled for 10 "
                     f"minutes: new requests queue for blocks and running ones risk preemption."),
        runbook=R.runbook((R.KV_USAGE_PANEL, R.PREEMPTION_PANEL, R.PHASE_PANEL),
                          f"read {R.on_agent(R.SUMMARY)} (\"kv\": blocks in use, cached, total) and "
                          f"{R.on_agent(R.DIAGNOSIS)} (a kv_pressure finding)",
                          "Queue time growing in the phase panel confirms it: add KV capacity or replicas."))


def moe_imbalance(config: RulesConfig) -> Alert:
    keep = config.target_labels + ("layer",)
    return Alert(
        alert="InfersightMoEImbalance", severity="warning", for_="15m",
        expr=f"max {by(keep)} ({C.MOE_IMBALANCE.sample}{{stat=\"{MAX_OVER_MEAN}\"}}) > {config.moe_max_over_mean:g}",
        summary=f"{AT}: MoE layer {{{{ $labels.layer }}}} hottest expert at {{{{ $value | printf \"%.3g\" }}}}x the mean load",
        description=(f"In MoE layer {{{{ $labels.layer }}}} of the engine behind {AT}, the hottest expert has been "
                     f"routed {{{{ $value | printf \"%.3g\" }}}}x the mean expert's tokens for 15 minutes (alert above "
                     f"{config.moe_max_over_mean:g}x, the level /api/v1/diagnosis reports). With expert "
                     f"parallelism the rank holding it sets every step's pace."),
        runbook=R.runbook((R.MOE_PANEL,), f"read {R.on_agent(R.DIAGNOSIS)} (moe_imbalance findings) and "
                                          f"{R.on_agent(R.SUMMARY)} (\"moe\" and \"expert_parallel\")",
                          "Replicate or re-place the hot experts (expert placement), or check whether the traffic "
                          "mix changed."))


def speculation_collapse(config: RulesConfig) -> Alert:
    now, day = spec_accept_ratio(config, "30m").record, spec_accept_ratio(config, "1d").record
    keep = config.target_labels + ("task",)
    return Alert(
        alert="InfersightSpeculationAcceptanceCollapse", severity="warning", for_="15m",
        expr=(f"{now} < {config.spec_collapse_ratio:g} * {day}\n"
              f"and\nsum {by(keep)} (increase({C.SPEC_DRAFT.sample}[30m])) >= {config.spec_min_drafts}"),
        summary=f"{AT}: speculation acceptance for task {{{{ $labels.task }}}} collapsed to {{{{ $value | humanizePercentage }}}}",
        description=(f"Task {{{{ $labels.task }}}} on {AT}: {{{{ $value | humanizePercentage }}}} of draft tokens were "
                     f"accepted over 30 minutes, under {config.spec_collapse_ratio:g} of the task's 1-day rate, over "
                     f"at least {config.spec_min_drafts} drafts. Rejected drafts cost verification time: speculation "
                     f"may now slow this task down."),
        runbook=R.runbook((R.SPEC_PANEL,), f"read {R.on_agent(R.DIAGNOSIS)} (speculation_recommendations: whether to "
                                           f"turn speculation off for the task) and {R.on_agent(R.SUMMARY)} "
                                           f"(\"spec\": accept rate and predicted speedup by task)",
                          "A new prompt template or a changed draft model is the usual cause."))


def recorder_over_budget(config: RulesConfig) -> Alert:
    t = config.target_labels
    ratio = record_name(t, f"{base_name(C.RECORDER_COST)}_per_{base_name(C.RECORDER_ENGINE).removeprefix(C.P)}",
                        "ratio_rate1h")
    return Alert(
        alert="InfersightFlightRecorderOverBudget", severity="warning", for_="15m",
        expr=f"{ratio}\n/\nmax {by(t)} ({C.RECORDER_BUDGET.sample}) > 1",
        summary=f"{AT}: the flight recorder cost {{{{ $value | printf \"%.3g\" }}}}x its budget",
        description=(f"Over the last hour the flight recorder on {AT} cost {{{{ $value | printf \"%.3g\" }}}}x the share "
                     f"of engine time its budget allows (measured from step times in its windows against the steps "
                     f"before), for 15 minutes. It should space its windows to stay inside the budget."),
        runbook=R.runbook((R.RECORDER_PANEL,), f"read {R.on_agent(R.SUMMARY)} (\"flight_recorder\": cost, budget, "
                                               f"interval) and {R.on_agent(R.CAPTURES)}",
                          "Triggered captures count against the budget too (the Triggered captures by reason panel): "
                          "raise --recorder-trigger-cooldown or lower --recorder-trigger-steps / "
                          "--recorder-window-steps."))


def gc_stalls(config: RulesConfig) -> Alert:
    t = by(config.target_labels)
    return Alert(
        alert="InfersightEngineGCStalls", severity="warning", for_="10m",
        expr=f"sum {t} (rate({C.HOST_PAUSE_SECONDS.sample}[10m])) > {config.gc_stall_share:g}",
        summary=f"{AT}: the engine stood still in garbage collection {{{{ $value | humanizePercentage }}}} of the time",
        description=(f"Over 10 minutes the engine's process behind {AT} spent {{{{ $value | humanizePercentage }}}} of "
                     f"wall-clock time in Python garbage collections (alert above {100 * config.gc_stall_share:g}%), "
                     f"for 10 minutes: every request in flight waits out each collection."),
        runbook=R.runbook((R.GC_PANEL, R.SLOW_PANEL), f"read {R.on_agent(R.SLOWEST)} (requests with slow_cause "
                                                      f"host_pause, and the seconds each one waited)",
                          "Full collections (generation 2) walk every tracked object: freeze the start-up heap "
                          "(gc.freeze() once warm, as infersight serve and vLLM do), keep fewer long-lived Python "
                          "objects per request, or raise the collector's thresholds (gc.set_threshold)."))


def engine_alerts(config: RulesConfig) -> list[Alert]:
    return [preemption_storm(config), kv_pressure(config), moe_imbalance(config), speculation_collapse(config),
            recorder_over_budget(config), gc_stalls(config)]
