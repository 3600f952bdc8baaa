"""The flight recorder's one config object (AgentConfig.flight_recorder), validated when built
(ValueError with a message for people; the CLI turns it into a usage error), and its CLI flag group."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

#: The cost assumed before any window is measured: the dearest single window measured on a machine
#: without other load (BENCHMARKS.md, "The flight recorder"): 0.75 s for 4 steps of tiny-moe on the
#: 2-core CPU, 0.60 s for vLLM's first window on the CPU, 0.40 s for an eager H200 window. With the old
#: guess of 0.05 s the first window came after 10 s of engine time and cost 0.1-0.5 s on the CPU, so a
#: 20-s run read 0.94% against a 0.5% budget (issue 32). The price of a high guess: at 0.5% the first
#: window waits 200 s of engine time; cheaper engines say so with --recorder-initial-cost.
INITIAL_COST_S = 1.0


@dataclass(frozen=True)
class RecorderConfig:
    """budget: share of engine time the recorder may cost (0.005 = 0.5%). window_steps: steps per
    sampled window; after_steps: steps after it that are charged to it too. directory: where window
    summaries go (None: memory only); keep / max_bytes bound them (memory and disk alike).
    min_interval_s: wall-clock floor between windows, however cheap. initial_cost_s: the cost
    assumed before the first is measured (INITIAL_COST_S: the dearest we measured; with a
    directory, the costs its kept windows measured come first). keep_traces: keep each window's
    trace file (default: the summary is kept, the trace deleted once read).
    Triggers (agent.recorder.triggers), each None to turn it off: the SLOs are the agent's
    --slo-*-s, judged at slo_quantile over the last slo_window requests; preemption_storm:
    preemptions within storm_steps steps; step_jump: the decode-step slowdown factor. A trigger takes
    a full capture of trigger_steps steps, at most one per trigger_cooldown_s.
    peak_tflops / peak_gbps: the roofline's ceilings, labelled given (None: looked up for the device
    that ran the window: measured by `infersight bench ceilings`, else its datasheet's, else none;
    kernels.ceilings.ceiling_lookup)."""

    budget: float = 0.005
    window_steps: int = 4
    after_steps: int = 2
    directory: str | None = None
    keep: int = 256
    max_bytes: int = 16 << 20
    min_interval_s: float = 1.0
    initial_cost_s: float = INITIAL_COST_S
    keep_traces: bool = False
    slo_quantile: float = 0.99
    slo_window: int = 200
    slo_min_requests: int = 20
    preemption_storm: int | None = 8
    storm_steps: int = 64
    step_jump: float | None = 2.0
    trigger_steps: int = 20
    trigger_cooldown_s: float = 300.0
    peak_tflops: float | None = None
    peak_gbps: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.budget < 0.5:
            raise ValueError(f"--recorder-budget must be in (0, 0.5) (a share of engine time), got {self.budget}")
        if not 1 <= self.window_steps <= 64:
            raise ValueError(f"recorder window steps must be in 1..64, got {self.window_steps}")
        if not 0 <= self.after_steps <= 64:
            raise ValueError(f"recorder after-steps must be in 0..64, got {self.after_steps}")
        if self.keep < 1:
            raise ValueError(f"--recorder-keep must be >= 1, got {self.keep}")
        if self.max_bytes < 1024:
            raise ValueError(f"--recorder-max-bytes must be >= 1024, got {self.max_bytes}")
        if not 0.0 <= self.min_interval_s <= 86400:
            raise ValueError(f"the recorder's minimum interval must be in [0, 86400] s, got {self.min_interval_s}")
        if not 0 < self.initial_cost_s <= 3600:
            raise ValueError(f"--recorder-initial-cost must be in (0, 3600] s, got {self.initial_cost_s}")
        if not 0.0 < self.slo_quantile < 1.0:
            raise ValueError(f"the recorder's SLO quantile must be in (0, 1), got {self.slo_quantile}")
        if self.slo_window < 1 or self.slo_min_requests < 1 or self.storm_steps < 1:
            raise ValueError("the recorder's SLO window, SLO minimum and storm steps must be >= 1")
        if self.preemption_storm is not None and self.preemption_storm < 1:
            raise ValueError(f"--recorder-preemption-storm must be >= 1, got {self.preemption_storm}")
        if self.step_jump is not None and not self.step_jump > 1.0:
            raise ValueError(f"--recorder-step-jump must be > 1 (a slowdown factor), got {self.step_jump}")
        if not 1 <= self.trigger_steps <= 1000:
            raise ValueError(f"--recorder-trigger-steps must be in 1..1000, got {self.trigger_steps}")
        if not self.trigger_cooldown_s >= 0:
            raise ValueError(f"the trigger cool-down must be >= 0 s, got {self.trigger_cooldown_s}")
        for name in ("peak_tflops", "peak_gbps"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--recorder-{name.replace('_', '-')} must be > 0, got {value}")

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        """--flight-recorder and the --recorder-* flags, in their own group."""
        g = parser.add_argument_group("flight recorder (sampled kernel windows inside an overhead budget; off unless "
                                      "--flight-recorder)")
        g.add_argument("--flight-recorder", action="store_true",
                       help="sample a few steps' kernel activity at a rate the budget allows; capture on triggers")
        g.add_argument("--recorder-budget", type=float, default=0.005, metavar="RATIO",
                       help="share of engine time the windows may cost, measured (default 0.005: 0.5%%)")
        g.add_argument("--recorder-window-steps", type=int, default=4, metavar="N",
                       help="steps per window (default 4)")
        g.add_argument("--recorder-dir", metavar="DIR",
                       help="keep the window summaries here too (default: memory only); a restarted agent starts "
                            "its budget from the window costs measured there")
        g.add_argument("--recorder-initial-cost", type=float, default=INITIAL_COST_S, metavar="SECONDS",
                       help="what a window is assumed to cost before one is measured (default %(default)s s: the "
                            "dearest we measured, so the first window keeps the budget; at 0.5%% it waits 200 s of "
                            "engine time). Lower it where windows are known to be cheap (~0.05 s on an H200)")
        g.add_argument("--recorder-keep", type=int, default=256, metavar="N",
                       help="window summaries kept (default 256)")
        g.add_argument("--recorder-max-bytes", type=int, default=16 << 20, metavar="BYTES",
                       help="bytes of window summaries kept, in memory and on disk each (default 16 MiB)")
        g.add_argument("--recorder-keep-traces", action="store_true",
                       help="keep each window's trace file (default: deleted once summarised)")
        g.add_argument("--recorder-preemption-storm", type=int, default=8, metavar="N",
                       help="capture when N requests are preempted within 64 steps (0: off; default 8)")
        g.add_argument("--recorder-step-jump", type=float, default=2.0, metavar="FACTOR",
                       help="capture when decode steps get FACTOR x slower at the same batch (0: off; default 2)")
        g.add_argument("--recorder-trigger-steps", type=int, default=20, metavar="N",
                       help="steps of a triggered full capture (default 20); SLO triggers use --slo-*-s")
        g.add_argument("--recorder-trigger-cooldown", type=float, default=300.0, metavar="SECONDS",
                       help="at most one triggered capture per this many seconds (default 300)")
        g.add_argument("--recorder-peak-tflops", type=float, metavar="TFLOPS",
                       help="the roofline's compute ceiling, labelled given (default: the window's device's, measured "
                       "by `infersight bench ceilings`, else its datasheet's, else none)")
        g.add_argument("--recorder-peak-gbps", type=float, metavar="GBPS",
                       help="the roofline's bandwidth ceiling, labelled given (default: as --recorder-peak-tflops)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RecorderConfig | None:
        """None without --flight-recorder; ValueError (exit 2) on a bad value."""
        if not args.flight_recorder:
            return None
        return cls(budget=args.recorder_budget, window_steps=args.recorder_window_steps,
                   directory=args.recorder_dir, keep=args.recorder_keep, max_bytes=args.recorder_max_bytes,
                   keep_traces=args.recorder_keep_traces, initial_cost_s=args.recorder_initial_cost,
                   preemption_storm=args.recorder_preemption_storm or None,
                   step_jump=args.recorder_step_jump or None, trigger_steps=args.recorder_trigger_steps,
                   trigger_cooldown_s=args.recorder_trigger_cooldown, peak_tflops=args.recorder_peak_tflops,
                   peak_gbps=args.recorder_peak_gbps)
