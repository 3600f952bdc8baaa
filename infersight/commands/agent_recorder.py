"""`infersight agent`'s flight-recorder flags (--flight-recorder and --recorder-*), and the
RecorderConfig they give."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infersight.agent.recorder.config import RecorderConfig


def add_recorder_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, in their own group."""
    g = parser.add_argument_group("flight recorder (sampled kernel windows inside an overhead budget; off unless "
                                  "--flight-recorder)")
    g.add_argument("--flight-recorder", action="store_true",
                   help="sample a few steps' kernel activity at a rate the budget allows; capture on triggers")
    g.add_argument("--recorder-budget", type=float, default=0.005, metavar="RATIO",
                   help="share of engine time the windows may cost, measured (default 0.005: 0.5%%)")
    g.add_argument("--recorder-window-steps", type=int, default=4, metavar="N", help="steps per window (default 4)")
    g.add_argument("--recorder-dir", metavar="DIR", help="keep the window summaries here too (default: memory only)")
    g.add_argument("--recorder-keep", type=int, default=256, metavar="N", help="window summaries kept (default 256)")
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


def recorder_config(args: argparse.Namespace) -> RecorderConfig | None:
    """None without --flight-recorder; ValueError (exit 2) on a bad value."""
    if not args.flight_recorder:
        return None
    from infersight.agent.recorder.config import RecorderConfig

    return RecorderConfig(budget=args.recorder_budget, window_steps=args.recorder_window_steps,
                          directory=args.recorder_dir, keep=args.recorder_keep, max_bytes=args.recorder_max_bytes,
                          keep_traces=args.recorder_keep_traces,
                          preemption_storm=args.recorder_preemption_storm or None,
                          step_jump=args.recorder_step_jump or None, trigger_steps=args.recorder_trigger_steps,
                          trigger_cooldown_s=args.recorder_trigger_cooldown, peak_tflops=args.recorder_peak_tflops,
                          peak_gbps=args.recorder_peak_gbps)
