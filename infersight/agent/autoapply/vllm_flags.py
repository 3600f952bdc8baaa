"""The loop's advice for vLLM, which cannot change speculation or max_num_seqs while it runs: the flags
to restart it with (`--speculative-config` JSON, `--max-num-seqs`), each with the measurement behind it,
or "no measurement yet" where there is none.

What the agent knows of a vLLM run (its stat-logger plugin's records, infersight.vllm.translate): each
step's drafted and accepted tokens (task 0: vLLM's stats are per step, not per request), no draft or
verify time, and no plain decode step beside the speculative ones; each finished request's lifecycle
rebuilt from vLLM's FinishedRequestStats. So:

- speculation: no speedup can be predicted from vLLM's records (no timed plain probe step: the basis
  correlate.spec_advice needs), and vLLM's speculation is global, not per task. The acceptance rate is
  measured; a change of `--speculative-config` is printed with "no measurement yet" unless advice with
  a probe-step basis exists (an agent reading both our engine and vLLM).
- max_num_seqs: the SLO share met is measured from the requests' TTFT and mean ITL (vLLM's own
  timings, as rebuilt), and the peak number of running sequences from its steps. A smaller limit is
  printed as the one to try, "no measurement yet": its effect is measured only by running vLLM with it
  (`infersight compare` of the two runs' files), an A/B the loop cannot run on a live vLLM.

Pure: `vllm_flag_advice` takes the numbers and returns a JSON-ready dict.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

NO_MEASUREMENT = "no measurement yet"


def _speculation_flag(advice: list[dict[str, Any]], spec_by_task: dict[str, dict[str, Any]]) -> dict[str, Any]:
    acted = [a for a in advice if a.get("action") in ("disable_speculation", "keep_speculation")]
    accept = {task: s.get("accept_rate") for task, s in spec_by_task.items()}
    measured = {"accept_rate_by_task": accept,
                "basis": "measured: drafted and accepted tokens from vLLM's SpecDecodingStats (per step; task 'other')"}
    if not acted:
        return {"flag": "--speculative-config", "status": NO_MEASUREMENT, "change": None,
                "command_line": "--speculative-config '{\"method\": ..., \"num_speculative_tokens\": ...}' (unchanged)",
                "why": "no speedup can be predicted on vLLM: its records have no timed plain decode step beside the "
                       "speculative ones (the basis the advice needs), and acceptance alone does not say whether "
                       "speculation pays; measure it with two runs (with and without the flag) and `infersight compare`",
                "measured": measured}
    off = sorted(str(a["task"]) for a in acted if a["action"] == "disable_speculation")
    on = sorted(str(a["task"]) for a in acted if a["action"] == "keep_speculation")
    numbers = {str(a["task"]): {k: a.get(k) for k in ("speedup", "speedup_low", "speedup_high", "basis")} for a in acted}
    if off and not on:
        return {"flag": "--speculative-config", "status": "advised", "change": "remove",
                "command_line": "(drop --speculative-config: serve without speculation)",
                "why": f"speculation is predicted to slow every task advised ({', '.join(off)})",
                "advice": numbers, "measured": measured}
    if off:
        return {"flag": "--speculative-config", "status": "advised", "change": None,
                "command_line": "--speculative-config (unchanged)",
                "why": f"speculation helps {', '.join(on)} and slows {', '.join(off)}; vLLM speculates for every "
                       f"request or none: serve the tasks from separate instances to get both",
                "advice": numbers, "measured": measured}
    return {"flag": "--speculative-config", "status": "advised", "change": None,
            "command_line": "--speculative-config (unchanged)", "why": "speculation is predicted to help every task "
            "advised", "advice": numbers, "measured": measured}


def _seq_flag(ttft_s: np.ndarray, itl_s: np.ndarray, slo: tuple[float, float] | None,
              peak_running: int | None, candidates: tuple[int, ...]) -> dict[str, Any]:
    measured: dict[str, Any] = {"requests": int(len(ttft_s)), "peak_running": peak_running,
                                "basis": "measured: TTFT and mean ITL of vLLM's finished requests (rebuilt from its "
                                         "FinishedRequestStats), running sequences from its SchedulerStats"}
    if slo is None:
        return {"flag": "--max-num-seqs", "status": NO_MEASUREMENT, "change": None,
                "command_line": "--max-num-seqs (unchanged)",
                "why": "no SLO stated (--auto-apply-slo-ttft-s, --auto-apply-slo-itl-s): nothing to tune against",
                "measured": measured}
    ttft_ok = ttft_s <= slo[0]
    met = ttft_ok & np.where(np.isfinite(itl_s), itl_s <= slo[1], True)
    share = float(met.mean()) if len(met) else None
    measured.update({"slo_ttft_s": slo[0], "slo_itl_s": slo[1], "share_met": share})
    if share is None or share >= 1.0 or not peak_running:
        why = ("no finished request yet" if share is None else "every request met the SLO: nothing to gain"
               if share >= 1.0 else "the peak number of running sequences is unknown")
        return {"flag": "--max-num-seqs", "status": NO_MEASUREMENT if share is None else "advised", "change": None,
                "command_line": "--max-num-seqs (unchanged)", "why": why, "measured": measured}
    target = candidates[0] if candidates else max(1, peak_running // 2)
    return {"flag": "--max-num-seqs", "status": NO_MEASUREMENT, "change": target,
            "command_line": f"--max-num-seqs {target}",
            "why": f"the SLO was met by {share:.0%} of {len(met)} requests (measured) with up to {peak_running} "
                   f"sequences running; a lower limit trades queueing for faster steps, and whether it meets the SLO "
                   f"more often is not measured yet: restart vLLM with the flag and compare the runs",
            "measured": measured}


def vllm_flag_advice(advice: list[dict[str, Any]], spec_by_task: dict[str, dict[str, Any]], ttft_s: np.ndarray,
                     itl_s: np.ndarray, slo: tuple[float, float] | None, peak_running: int | None,
                     candidates: tuple[int, ...] = ()) -> dict[str, Any]:
    """The flags to change on vLLM (see the module docstring). advice: spec_advice.recommendations;
    spec_by_task: spec_speedup.summary_by_task; ttft_s / itl_s: per finished request (seconds);
    slo: (TTFT, ITL) objectives or None; peak_running: the most sequences a step ran, or None."""
    flags = [_speculation_flag(advice, spec_by_task), _seq_flag(ttft_s, itl_s, slo, peak_running, candidates)]
    line = " ".join(f["command_line"] for f in flags if f["change"] is not None and not f["command_line"].startswith("("))
    return {"engine": "vllm", "applies_at_run_time": False,
            "basis": "vLLM cannot change speculation or max_num_seqs while it runs: these are the flags to restart "
                     "it with; a flag marked 'no measurement yet' has no measured effect behind it",
            "flags": flags, "restart_with": line or None,
            "speculative_config_example": json.dumps({"method": "draft_model", "model": "...",
                                                      "num_speculative_tokens": 4})}
