"""The loop's advice on vLLM, which cannot change at run time: flags with the measurement behind them, or
"no measurement yet" where there is none (agent.autoapply.vllm_flags)."""
from __future__ import annotations

import json

import numpy as np

from infersight.agent.autoapply.vllm_flags import NO_MEASUREMENT, vllm_flag_advice

SPEC = {"other": {"accept_rate": 0.4}}


def _flags(doc: dict) -> dict[str, dict]:
    return {f["flag"]: f for f in doc["flags"]}


def test_without_a_probe_basis_speculation_has_no_measurement() -> None:
    doc = vllm_flag_advice([], SPEC, np.array([0.1]), np.array([0.01]), None, 4)
    spec, seqs = _flags(doc)["--speculative-config"], _flags(doc)["--max-num-seqs"]
    assert spec["status"] == NO_MEASUREMENT and spec["change"] is None
    assert "no timed plain decode step" in spec["why"] and spec["measured"]["accept_rate_by_task"] == {"other": 0.4}
    assert seqs["status"] == NO_MEASUREMENT and "no SLO stated" in seqs["why"]
    assert doc["applies_at_run_time"] is False and doc["restart_with"] is None
    json.loads(doc["speculative_config_example"])


def test_slo_missed_prints_a_smaller_limit_to_try_unmeasured() -> None:
    ttft = np.array([0.1, 0.1, 0.9, 0.1])  # one of four over 0.5 s
    itl = np.array([0.01, 0.2, 0.01, np.nan])  # one over 0.05 s; the last has one token
    doc = vllm_flag_advice([], SPEC, ttft, itl, (0.5, 0.05), 16)
    seqs = _flags(doc)["--max-num-seqs"]
    assert seqs["measured"]["share_met"] == 0.5  # requests 0 and 3 met both objectives
    assert seqs["change"] == 8 and seqs["command_line"] == "--max-num-seqs 8" and seqs["status"] == NO_MEASUREMENT
    assert doc["restart_with"] == "--max-num-seqs 8"


def test_advice_with_a_basis_is_rendered_as_the_global_flag() -> None:
    off = {"task": "creative", "action": "disable_speculation", "speedup": 0.5, "speedup_low": 0.4, "speedup_high": 0.6,
           "basis": "predicted_from_probe_steps"}
    spec = _flags(vllm_flag_advice([off], SPEC, np.empty(0), np.empty(0), None, None))["--speculative-config"]
    assert spec["change"] == "remove" and spec["advice"]["creative"]["speedup_high"] == 0.6
    on = {**off, "task": "code", "action": "keep_speculation", "speedup": 1.5, "speedup_low": 1.2, "speedup_high": 1.8}
    spec = _flags(vllm_flag_advice([off, on], SPEC, np.empty(0), np.empty(0), None, None))["--speculative-config"]
    assert spec["change"] is None and "every request or none" in spec["why"]
