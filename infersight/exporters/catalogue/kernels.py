"""The flight recorder (infersight.agent.recorder.flight_recorder): sampled kernel windows, its overhead
budget, and the captures latency objectives and anomalies trigger (KERNEL_METRICS).

Its counters live in the agent state like the others; its gauges are rendered by
infersight.exporters.recorder. Kernel series sum over sampled windows only: read them as shares and
ratios (time by category over all time, idle over step window), not as absolute rates. Label values
are bounded: category is kernels.analysis.categories.CATEGORIES, phase is correlate.kernel_windows.WINDOW_PHASES,
reason and outcome are the enums below, source is kernels.ceilings.device_ceilings.CEILING_KINDS."""
from __future__ import annotations

from infersight.exporters.catalogue.spec import MetricSpec, P


def _per(num: str, den: str, by: str) -> str:
    return (f"sum by ({by}) (rate({num}[$__rate_interval])) / "
            f"clamp_min(sum by ({by}) (rate({den}[$__rate_interval])), 1e-9)")


KERNEL_TIME = MetricSpec(P + "kernel_time_seconds", "counter",
                         "Device activity time (kernels, copies; on a CPU engine: op time) in the flight recorder's "
                         "sampled windows, by kernel category and engine phase.", ("category", "phase"), "seconds",
                         views={"share": f"sum by (category) (rate({P}kernel_time_seconds_total[$__rate_interval]))"
                                f" / ignoring(category) group_left sum(rate({P}kernel_time_seconds_total"
                                f"[$__rate_interval]))"})
KERNEL_ACTIVITIES = MetricSpec(P + "kernel_activities", "counter",
                               "Kernels launched (on a CPU engine: op calls) in sampled windows, by phase.", ("phase",))
KERNEL_SAMPLED_STEPS = MetricSpec(P + "kernel_sampled_steps", "counter",
                                  "Engine steps covered by sampled windows, by the phases they ran.", ("phase",),
                                  views={"kernels_per_step": _per(P + "kernel_activities_total",
                                                                  P + "kernel_sampled_steps_total", "phase")})
KERNEL_STEP_WINDOW = MetricSpec(P + "kernel_step_window_seconds", "counter",
                                "Summed step windows of sampled steps (first to last activity of each step and "
                                "phase), by phase.", ("phase",), "seconds")
KERNEL_IDLE = MetricSpec(P + "kernel_idle_seconds", "counter",
                         "Device idle time inside sampled step windows (launch gaps; on a CPU engine: time between "
                         "ops), by phase.", ("phase",), "seconds",
                         views={"gap_share": _per(P + "kernel_idle_seconds_total",
                                                  P + "kernel_step_window_seconds_total", "phase")})
KERNEL_FLOPS = MetricSpec(P + "kernel_modelled_flops", "counter",
                          "FLOPs the roofline model assigns to the sampled steps, by category.",
                          ("category",))
KERNEL_BYTES = MetricSpec(P + "kernel_modelled_bytes", "counter",
                          "Bytes the roofline model assigns to the sampled steps, by category.", ("category",), "bytes")
KERNEL_ROOF_TIME = MetricSpec(P + "kernel_roofline_seconds", "counter",
                              "Activity time of the modelled categories in sampled steps (the time the modelled "
                              "FLOPs and bytes took), by category.", ("category",), "seconds",
                              views={"flops_per_second": _per(P + "kernel_modelled_flops_total",
                                                              P + "kernel_roofline_seconds_total", "category"),
                                     "bytes_per_second": _per(P + "kernel_modelled_bytes_total",
                                                              P + "kernel_roofline_seconds_total", "category")})
KERNEL_ROOF_FRACTION = MetricSpec(P + "kernel_roofline_fraction", "gauge",
                                  "Achieved FLOP/s (modelled FLOPs over measured time) over the roof at the "
                                  "category's arithmetic intensity, in the last window that modelled it (1.0 = on "
                                  "the roofline). The roof is the kernel_peak_* ceilings; absent when none is known "
                                  "for the device.", ("category",), "ratio")
KERNEL_PEAK_FLOPS = MetricSpec(P + "kernel_peak_flops_per_second", "gauge",
                               "The compute ceiling the roofline uses, by device (ceiling) and source: measured "
                               "(`infersight bench ceilings` on this machine), datasheet or given "
                               "(--recorder-peak-tflops).", ("ceiling", "source"))
KERNEL_PEAK_BYTES = MetricSpec(P + "kernel_peak_bytes_per_second", "gauge",
                               "The memory-bandwidth ceiling the roofline uses, by device (ceiling) and source: "
                               "measured (a device copy by `infersight bench ceilings`), datasheet or given "
                               "(--recorder-peak-gbps).", ("ceiling", "source"))
RECORDER_WINDOWS = MetricSpec(P + "recorder_windows", "counter",
                              "Flight-recorder windows, by outcome (analysed, failed: no trace or one that did not "
                              "parse, refused: a capture was in progress).", ("outcome",))
#: RECORDER_WINDOWS outcome values.
RECORDER_OUTCOMES = ("analysed", "failed", "refused")
RECORDER_COST = MetricSpec(P + "recorder_cost_seconds", "counter",
                           "Engine time the flight recorder's windows (kind window) and triggered captures (kind "
                           "triggered) cost, measured from step times in and right after them against the steps "
                           "before.", ("kind",), "seconds")
RECORDER_ENGINE = MetricSpec(P + "recorder_engine_seconds", "counter",
                             "Engine step time observed by the flight recorder (steps that ran requests): the "
                             "budget's denominator.", (), "seconds",
                             views={"cost_ratio": f"sum(rate({P}recorder_cost_seconds_total[$__rate_interval])) / "
                                    f"clamp_min(sum(rate({P}recorder_engine_seconds_total[$__rate_interval])), 1e-9)"})
RECORDER_BUDGET = MetricSpec(P + "recorder_budget_ratio", "gauge",
                             "The overhead budget: the share of engine time the flight recorder may cost.", (), "ratio")
RECORDER_COST_RATIO = MetricSpec(P + "recorder_cost_ratio", "gauge",
                                 "Measured cost of the flight recorder since the agent started, over engine time.",
                                 (), "ratio")
RECORDER_INTERVAL = MetricSpec(P + "recorder_window_interval_seconds", "gauge",
                               "Engine seconds between windows that the budget allows at the current reservation (the dearer of the cost estimate and the dearest recent window).",
                               (), "seconds")
RECORDER_TRIGGERED = MetricSpec(P + "recorder_triggered_captures", "counter",
                                "Full captures the flight recorder took on a trigger, by reason.", ("reason",))
#: RECORDER_TRIGGERED reason values (agent.recorder.triggers).
RECORDER_REASONS = ("slo_ttft", "slo_itl", "slo_e2e", "preemption_storm", "step_time_jump")
KERNEL_METRICS: tuple[MetricSpec, ...] = (
    KERNEL_TIME, KERNEL_ACTIVITIES, KERNEL_SAMPLED_STEPS, KERNEL_STEP_WINDOW, KERNEL_IDLE, KERNEL_FLOPS, KERNEL_BYTES,
    KERNEL_ROOF_TIME, KERNEL_ROOF_FRACTION, KERNEL_PEAK_FLOPS, KERNEL_PEAK_BYTES, RECORDER_WINDOWS, RECORDER_COST,
    RECORDER_ENGINE, RECORDER_BUDGET, RECORDER_COST_RATIO, RECORDER_INTERVAL, RECORDER_TRIGGERED,
)
