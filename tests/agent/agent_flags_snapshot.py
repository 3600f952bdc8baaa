"""What `infersight agent`'s command line gives: every flag (names, defaults, types, choices) and the
config the command builds from a full and a minimal argv, as one JSON document.

Run on the commit before the AgentConfig split (issue 31 item 4) it wrote snapshots/agent_flags.json;
test_agent_flags_unchanged.py runs it on the current tree and compares. The config is the one the real
command builds: `infersight agent`'s own run(), with the Agent replaced by a stub that keeps its config
(nothing is bound or started). Today's grouped config is read back under the old flat field names
(RENAMED), so the two documents compare field by field.

    python tests/agent/agent_flags_snapshot.py --write   # rewrite the snapshot (the old tree on sys.path)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).parent / "snapshots" / "agent_flags.json"

#: The pre-split flat AgentConfig field -> where it lives now (group.field). The README changelog lists it.
RENAMED = {
    "max_expert_series": "exposition.max_expert_series", "top_hot_pairs": "exposition.top_hot_pairs",
    "vllm_compat": "exposition.vllm_compat", "model_name": "exposition.model_name",
    "slow_quantile": "slow.quantile", "slow_window": "slow.window",
    "min_requests_for_p99": "slow.min_requests_for_p99", "slo_ttft_s": "slow.slo_ttft_s",
    "slo_itl_s": "slow.slo_itl_s", "slo_e2e_s": "slow.slo_e2e_s",
    "retention_bytes": "retention.rows_bytes", "retain_requests": "retention.requests",
    "max_task_labels": "limits.max_task_labels", "max_moe_layers": "limits.max_moe_layers",
    "max_moe_experts": "limits.max_moe_experts",
    # Not a field before the split: the agent built RecordLimits(the three above) and this one kept its default.
    "max_tokens_per_event": "limits.max_tokens_per_event",
    "token": "captures.token", "token_file": "captures.token_file",
    "capture_min_interval_s": "captures.min_interval_s", "auto_capture_ttft_p99_s": "captures.auto_ttft_p99_s",
    "auto_capture_kv_usage": "captures.auto_kv_usage", "auto_capture_preemptions": "captures.auto_preemptions",
    "auto_capture_cooldown_s": "captures.auto_cooldown_s",
    "gpu_source": "gpu.source", "gpu_url": "gpu.url", "gpu_interval_s": "gpu.interval_s",
    "energy_gpus": "gpu.energy_gpus",
    # Not a field before the split (added since): compared only where the snapshot has it, i.e. nowhere.
    "energy_fit_min_s": "gpu.energy_fit_min_s", "energy_static": "gpu.energy_static",
    "vllm_kv_events": "vllm_kv.events", "vllm_kv_replay": "vllm_kv.replay", "vllm_kv_topic": "vllm_kv.topic",
    "vllm_kv_replay_timeout_s": "vllm_kv.replay_timeout_s", "vllm_kv_remember_bytes": "vllm_kv.remember_bytes",
    "vllm_url": "vllm_server.url", "vllm_metrics_interval_s": "vllm_server.metrics_interval_s",
    "vllm_profiler_dir": "vllm_server.profiler_dir", "vllm_capture_wait_s": "vllm_server.capture_wait_s",
}

#: Every flag of the old command line, each with a value that differs from its default and from the
#: others where the types allow (a value landing in the wrong field shows).
FULL = ["--ring", "r1", "--ring", "r2", "--discover", "--discover-prefix", "pfx-", "--listen", "127.0.0.2:9999",
        "--max-connections", "33", "--poll-interval", "0.25", "--parquet-dir", "/tmp/pq", "--retention-mib", "3.5",
        "--vllm-compat", "--model-name", "m1", "--max-expert-series", "77", "--max-task-labels", "11",
        "--max-moe-layers", "12", "--max-moe-experts", "13", "--duration", "9",
        "--slow-quantile", "0.9", "--slow-window", "55", "--slo-ttft-s", "0.5", "--slo-itl-s", "0.05",
        "--slo-e2e-s", "5",
        "--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-protocol", "grpc", "--trace-sample-ratio", "0.3",
        "--export-content", "--otlp-metrics", "--otlp-receiver", "127.0.0.1:4319",
        "--otlp-receiver-grpc", "127.0.0.1:4320", "--otlp-join-wait", "7", "--otlp-queue-spans", "99",
        "--otlp-queue-bytes", "123456", "--otlp-export-timeout", "1.5", "--otlp-shutdown-timeout", "2.5",
        "--trace-buffer-bytes", "654321",
        "--gpu-source", "dcgm-exporter", "--gpu-url", "http://127.0.0.3:9400/metrics", "--gpu-interval", "0.7",
        "--energy-gpus", "0,2",
        "--vllm-kv-events", "tcp://127.0.0.1:5557", "--vllm-kv-replay", "tcp://127.0.0.1:5558",
        "--vllm-kv-topic", "kv2", "--vllm-kv-replay-timeout", "3", "--vllm-kv-remember-mib", "2",
        "--vllm-url", "http://127.0.0.1:8000", "--vllm-metrics-interval", "1.5", "--vllm-profiler-dir", "/tmp/prof",
        "--vllm-capture-wait", "30",
        "--flight-recorder", "--recorder-budget", "0.01", "--recorder-window-steps", "6", "--recorder-dir", "/tmp/rec",
        "--recorder-keep", "17", "--recorder-max-bytes", "4096000", "--recorder-keep-traces",
        "--recorder-preemption-storm", "5", "--recorder-step-jump", "3", "--recorder-trigger-steps", "21",
        "--recorder-trigger-cooldown", "100", "--recorder-peak-tflops", "50", "--recorder-peak-gbps", "900"]
MINIMAL = ["--ring", "r1"]


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def flat_config(config: Any) -> dict[str, Any]:
    """The config's values under the old flat names (a pre-split config is flat already)."""
    from infersight.agent.rings.record_limits import RecordLimits  # before the split and after

    out = {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if "limits" not in out:  # before the split: the agent's RecordLimits took its default here
        out["max_tokens_per_event"] = RecordLimits().max_tokens_per_event
    for old, new in RENAMED.items():
        group, name = new.split(".")
        if group in out and isinstance(out[group], dict):
            out[old] = out[group].pop(name)
    for group in {new.split(".")[0] for new in RENAMED.values()}:
        if isinstance(out.get(group), dict):
            assert out[group] == {}, f"{group} has fields RENAMED does not map: {out[group]}"
            del out[group]
    return dict(sorted(out.items()))


def built_config(argv: list[str]) -> dict[str, Any]:
    """The config `infersight agent ARGV` builds (its run() with a stub Agent), flat."""
    import infersight.agent.lean_imports as lean
    import infersight.agent.service as service
    from infersight.cli import build_parser

    built: list[Any] = []

    class StubAgent:
        def __init__(self, config: Any, *_: Any, **__: Any) -> None:
            built.append(config)

        def run(self, duration: float | None) -> None:
            pass

        def stop(self) -> None:
            pass

    saved = service.Agent, lean.import_pandas_without_pyarrow, {s: signal.getsignal(s) for s in (signal.SIGINT,
                                                                                                 signal.SIGTERM)}
    service.Agent, lean.import_pandas_without_pyarrow = StubAgent, lambda: False  # type: ignore[misc, assignment]
    try:
        args = build_parser().parse_args(["agent", *argv])
        assert args.func(args) == 0
    finally:
        service.Agent, lean.import_pandas_without_pyarrow = saved[0], saved[1]  # type: ignore[misc]
        for s, handler in saved[2].items():
            signal.signal(s, handler)
    (config,) = built
    return flat_config(config)


def flags() -> list[dict[str, Any]]:
    """The agent subcommand's flags, sorted by name: what a user types and what it defaults to."""
    from infersight.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    agent = sub.choices["agent"]
    out = []
    for a in agent._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        out.append({"flags": sorted(a.option_strings), "dest": a.dest, "default": _plain(a.default),
                    "const": _plain(a.const), "nargs": a.nargs, "choices": _plain(a.choices),
                    "required": a.required, "action": type(a).__name__,
                    "type": getattr(a.type, "__name__", None if a.type is None else "callable"),
                    "metavar": a.metavar})
    return sorted(out, key=lambda d: d["flags"])


def snapshot() -> dict[str, Any]:
    return {"flags": flags(), "full": built_config(FULL), "minimal": built_config(MINIMAL)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the snapshot (else print the document)")
    parser.add_argument("--commit", default="", help="the commit whose tree is imported (for the header)")
    args = parser.parse_args()
    doc = snapshot()
    if not args.write:
        json.dump(doc, sys.stdout, indent=1)
        return
    import infersight

    doc = {"_made_by": f"python tests/agent/agent_flags_snapshot.py --write, importing infersight from a git archive of"
                       f" commit {args.commit or '(not given)'}: the command line before the AgentConfig split",
           **doc}
    SNAPSHOT.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
