"""AutoApplyConfig: the closed loop's settings (`infersight agent --auto-apply ...`), and its flag group.

Off by default. The bounds are what a careful SRE running a canary would keep: one change in flight,
a minimum window before any verdict, a maximum window after which an unconfirmed change goes back, a
cool-down between changes, and a minimum number of requests in each arm.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from infersight.config_error import ConfigError

#: What --auto-apply may name.
KNOBS = ("speculation", "max-num-seqs")


@dataclass(frozen=True)
class AutoApplyConfig:
    """knobs: what the loop may change ("speculation": the per-task speculation policy; "max-num-seqs":
    the scheduler's limit, tuned against slo_ttft_s and slo_itl_s, which it then needs).
    control_share: the share of a task's requests that keeps the old policy during a canary.
    min_window_s / max_window_s: no verdict before the first; an unconfirmed change is rolled back at
    the second. min_requests: finished requests each arm needs before a verdict. cooldown_s: after a
    verdict, no new change for this long. seq_candidates: the max_num_seqs values tried against the
    configured one (empty: half of it). interval_resamples: bootstrap resamples of each verdict.
    recheck_s: a task whose speculation the loop disabled gets a canary the other way (a random share
    of its requests speculates again) this long after the disable was kept, or after its last re-check
    found no gain: with speculation off, no speculative step of it is seen, so the advice alone could
    never re-enable it."""

    knobs: tuple[str, ...] = ()
    control_share: float = 0.5
    min_window_s: float = 30.0
    max_window_s: float = 600.0
    min_requests: int = 20
    cooldown_s: float = 60.0
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    seq_window_s: float = 30.0
    seq_windows: int = 6
    seq_candidates: tuple[int, ...] = ()
    interval_resamples: int = 1000
    recheck_s: float = 1800.0
    seed: int = 0

    def __post_init__(self) -> None:
        for knob in self.knobs:
            if knob not in KNOBS:
                raise ConfigError(f"--auto-apply takes {', '.join(KNOBS)}, got {knob!r}")
        if not 0.05 <= self.control_share <= 0.95:
            raise ConfigError(f"--auto-apply-control-share must be in [0.05, 0.95], got {self.control_share}")
        if not 0 < self.min_window_s <= self.max_window_s:
            raise ConfigError(f"--auto-apply-min-window-s must be > 0 and <= --auto-apply-max-window-s, got "
                              f"{self.min_window_s} and {self.max_window_s}")
        if self.min_requests < 5:
            raise ConfigError(f"--auto-apply-min-requests must be >= 5 (a bootstrap of fewer says nothing), "
                              f"got {self.min_requests}")
        if self.cooldown_s < 0:
            raise ConfigError(f"--auto-apply-cooldown-s must be >= 0, got {self.cooldown_s}")
        if "max-num-seqs" in self.knobs and (self.slo_ttft_s is None or self.slo_itl_s is None):
            raise ConfigError("--auto-apply max-num-seqs needs the SLO it tunes against: --auto-apply-slo-ttft-s "
                              "and --auto-apply-slo-itl-s")
        for flag, value in (("--auto-apply-slo-ttft-s", self.slo_ttft_s), ("--auto-apply-slo-itl-s", self.slo_itl_s)):
            if value is not None and not value > 0:
                raise ConfigError(f"{flag} must be > 0 s, got {value}")
        if self.seq_window_s <= 0 or self.seq_windows < 2 or self.seq_windows % 2:
            raise ConfigError(f"--auto-apply-seq-window-s must be > 0 and --auto-apply-seq-windows an even "
                              f"number >= 2, got {self.seq_window_s} and {self.seq_windows}")
        if any(c < 1 for c in self.seq_candidates):
            raise ConfigError(f"--auto-apply-seq-candidates are limits >= 1, got {self.seq_candidates}")
        if not self.recheck_s > 0:
            raise ConfigError(f"--auto-apply-recheck-s must be > 0, got {self.recheck_s}")
        if self.interval_resamples < 200:
            raise ConfigError(f"interval_resamples must be >= 200, got {self.interval_resamples}")

    @property
    def on(self) -> bool:
        return bool(self.knobs)

    @staticmethod
    def add_flags(parser: argparse.ArgumentParser) -> None:
        loop = parser.add_argument_group("the closed loop (off unless --auto-apply is given): advice applied to "
                                         "our engine behind a canary, kept only when measured better")
        loop.add_argument("--auto-apply", action="append", choices=KNOBS, metavar="KNOB",
                          help="let the agent change KNOB: speculation (per task) or max-num-seqs (against the "
                               "SLO below); repeat for both")
        loop.add_argument("--auto-apply-control-share", type=float, default=0.5, metavar="SHARE",
                          help="share of a task's requests that keep the old policy during a canary (default 0.5)")
        loop.add_argument("--auto-apply-min-window-s", type=float, default=30.0, metavar="SECONDS",
                          help="no verdict on a canary before this (default 30)")
        loop.add_argument("--auto-apply-max-window-s", type=float, default=600.0, metavar="SECONDS",
                          help="a canary not confirmed by then is rolled back (default 600)")
        loop.add_argument("--auto-apply-min-requests", type=int, default=20, metavar="N",
                          help="finished requests each arm needs before a verdict (default 20)")
        loop.add_argument("--auto-apply-cooldown-s", type=float, default=60.0, metavar="SECONDS",
                          help="no new change for this long after a verdict (default 60)")
        loop.add_argument("--auto-apply-slo-ttft-s", type=float, metavar="SECONDS",
                          help="max-num-seqs: the TTFT objective (default: --slo-ttft-s)")
        loop.add_argument("--auto-apply-slo-itl-s", type=float, metavar="SECONDS",
                          help="max-num-seqs: the mean inter-token latency objective (default: --slo-itl-s)")
        loop.add_argument("--auto-apply-seq-window-s", type=float, default=30.0, metavar="SECONDS",
                          help="max-num-seqs: length of each alternating window (default 30)")
        loop.add_argument("--auto-apply-seq-windows", type=int, default=6, metavar="N",
                          help="max-num-seqs: windows per trial, alternating old and new (even; default 6)")
        loop.add_argument("--auto-apply-seq-candidates", type=int, nargs="+", default=[], metavar="N",
                          help="max-num-seqs: limits to try (default: half the engine's)")
        loop.add_argument("--auto-apply-recheck-s", type=float, default=1800.0, metavar="SECONDS",
                          help="speculation: a task the loop disabled gets a canary with speculation on again "
                               "this long after (kept only when measured better; default 1800)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AutoApplyConfig:
        return cls(knobs=tuple(dict.fromkeys(args.auto_apply or ())), control_share=args.auto_apply_control_share,
                   min_window_s=args.auto_apply_min_window_s, max_window_s=args.auto_apply_max_window_s,
                   min_requests=args.auto_apply_min_requests, cooldown_s=args.auto_apply_cooldown_s,
                   slo_ttft_s=args.auto_apply_slo_ttft_s or getattr(args, "slo_ttft_s", None),
                   slo_itl_s=args.auto_apply_slo_itl_s or getattr(args, "slo_itl_s", None),
                   seq_window_s=args.auto_apply_seq_window_s, seq_windows=args.auto_apply_seq_windows,
                   seq_candidates=tuple(args.auto_apply_seq_candidates), recheck_s=args.auto_apply_recheck_s)
