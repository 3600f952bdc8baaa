"""`infersight agent`."""
from __future__ import annotations

import argparse

from infersight.commands.numeric_flags import bounded_float


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_gpu_list(value: str) -> tuple[int, ...]:
    """--energy-gpus: comma-separated device indices ("" for all); ValueError (exit 2) otherwise."""
    try:
        gpus = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        gpus = (-1,)
    if value.strip() and (not gpus or min(gpus) < 0):
        raise ValueError(f"--energy-gpus takes device indices such as 0,1, got {value!r}")
    return gpus


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    if not args.parquet_dir:  # pyarrow is for Parquet only: about 35 MB less resident (agent/lean_imports.py)
        from infersight.agent.lean_imports import import_pandas_without_pyarrow

        import_pandas_without_pyarrow()
    from infersight.agent.config import AgentConfig
    from infersight.agent.service import Agent
    from infersight.commands.agent_recorder import recorder_config
    from infersight.commands.agent_tracing import tracing_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-agent %(levelname)s %(message)s")
    host, port = parse_listen(args.listen)
    agent = Agent(AgentConfig(rings=args.ring or [], discover=args.discover or bool(args.discover_prefix),
                              discover_prefix=args.discover_prefix or "infersight-", host=host, port=port,
                              max_connections=args.max_connections,
                              poll_interval_s=args.poll_interval, parquet_dir=args.parquet_dir,
                              retention_bytes=int(args.retention_mib * (1 << 20)),
                              vllm_compat=args.vllm_compat, model_name=args.model_name,
                              max_expert_series=args.max_expert_series, slow_quantile=args.slow_quantile,
                              max_task_labels=args.max_task_labels, max_moe_layers=args.max_moe_layers,
                              max_moe_experts=args.max_moe_experts,
                              slow_window=args.slow_window, slo_ttft_s=args.slo_ttft_s, slo_itl_s=args.slo_itl_s,
                              slo_e2e_s=args.slo_e2e_s, tracing=tracing_config(args),
                              vllm_kv_events=args.vllm_kv_events, vllm_kv_replay=args.vllm_kv_replay,
                              vllm_kv_topic=args.vllm_kv_topic, vllm_kv_replay_timeout_s=args.vllm_kv_replay_timeout,
                              vllm_kv_remember_bytes=int(args.vllm_kv_remember_mib * (1 << 20)),
                              vllm_url=args.vllm_url, vllm_metrics_interval_s=args.vllm_metrics_interval,
                              vllm_profiler_dir=args.vllm_profiler_dir, vllm_capture_wait_s=args.vllm_capture_wait,
                              gpu_source=args.gpu_source, gpu_url=args.gpu_url, gpu_interval_s=args.gpu_interval,
                              energy_gpus=parse_gpu_list(args.energy_gpus),
                              flight_recorder=recorder_config(args)))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run(args.duration)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from infersight.commands.agent_tracing import add_tracing_arguments

    agent = sub.add_parser("agent", help="the sidecar: attach to probe rings, serve /metrics and the JSON API")
    agent.add_argument("--ring", action="append", help="ring name to attach (repeatable)")
    agent.add_argument("--discover", action="store_true", help="also attach every infersight-* ring that appears")
    agent.add_argument("--discover-prefix", metavar="PREFIX",
                       help="discover only rings whose names start with PREFIX (implies --discover)")
    agent.add_argument("--listen", default="127.0.0.1:9464", help="HOST:PORT (default 127.0.0.1:9464)")
    agent.add_argument("--max-connections", type=int, default=64, metavar="N",
                       help="connections each HTTP listener holds at once (the API, the OTLP/HTTP receiver); "
                            "one more is answered 503 and counted (default 64)")
    agent.add_argument("--poll-interval", type=float, default=0.1, help="seconds between ring reads")
    agent.add_argument("--parquet-dir", help="write per-request rows to DIR/requests.parquet")
    agent.add_argument("--retention-mib", type=bounded_float(0.0625, 1 << 16), default=8.0, metavar="MIB",
                       help="finished requests' rows kept for the summary and /api/v1/requests, in MiB of row data "
                            "(default 8: ~16,000 requests); the oldest go first")
    agent.add_argument("--vllm-compat", action="store_true", help="also serve vLLM metric names")
    agent.add_argument("--model-name", default="tiny-moe", help="model_name label of the vLLM-compatible view")
    agent.add_argument("--max-expert-series", type=int, default=512, help="cap on layers x experts series")
    agent.add_argument("--max-task-labels", type=int, default=64, metavar="N",
                       help="distinct task labels over all rings; further ones count as \"other\" (default 64)")
    agent.add_argument("--max-moe-layers", type=int, default=256, metavar="N",
                       help="MoE records of layer N or above are refused and counted (default 256)")
    agent.add_argument("--max-moe-experts", type=int, default=1024, metavar="N",
                       help="MoE records of layers with more experts are refused and counted (default 1024)")
    agent.add_argument("--duration", type=float, help="stop after this many seconds")
    slow = agent.add_argument_group("slow requests (above a rolling quantile of e2e, or over an SLO when one is given)")
    slow.add_argument("--slow-quantile", type=float, default=0.99, metavar="Q",
                      help="a request is slow above this quantile of recent e2e (default 0.99: at most 1%% flagged)")
    slow.add_argument("--slow-window", type=int, default=1000, metavar="N",
                      help="the quantile is over the last N finished requests (default 1000)")
    slow.add_argument("--slo-ttft-s", type=float, metavar="SECONDS", help="slow: TTFT over this (replaces the quantile)")
    slow.add_argument("--slo-itl-s", type=float, metavar="SECONDS",
                      help="slow: mean inter-token latency over this (replaces the quantile)")
    slow.add_argument("--slo-e2e-s", type=float, metavar="SECONDS", help="slow: e2e over this (replaces the quantile)")
    add_tracing_arguments(agent)
    gpu = agent.add_argument_group("GPU telemetry and energy per request")
    gpu.add_argument("--gpu-source", default="auto", choices=("auto", "dcgm", "dcgm-exporter", "nvml", "none"),
                     help="auto: DCGM, then --gpu-url, then NVML, then none")
    gpu.add_argument("--gpu-url", metavar="URL", help="a dcgm-exporter /metrics URL")
    gpu.add_argument("--gpu-interval", type=float, default=1.0, metavar="SECONDS",
                     help="GPU sampling interval (>= 0.1 s; default 1)")
    gpu.add_argument("--energy-gpus", default="", metavar="0,1",
                     help="the GPUs the engine runs on, whose energy is split over its steps (default: all)")
    kv = agent.add_argument_group("vLLM KV cache events (off unless --vllm-kv-events is given)")
    kv.add_argument("--vllm-kv-events", metavar="tcp://HOST:PORT",
                    help="vLLM's --kv-events-config endpoint: the agent binds it (vLLM connects to a "
                         "non-wildcard endpoint), or connects to this host's port for a wildcard one")
    kv.add_argument("--vllm-kv-replay", metavar="tcp://HOST:PORT",
                    help="vLLM's replay_endpoint: sequence gaps are asked for there")
    kv.add_argument("--vllm-kv-topic", default="kv", help="vLLM's KV events topic (default kv)")
    kv.add_argument("--vllm-kv-replay-timeout", type=float, default=5.0, metavar="SECONDS",
                    help="give a replay up after this long without an answer, its gaps counted lost "
                         "(0.01-60 s; default 5: vLLM answers from its engine process, slow on a loaded host)")
    kv.add_argument("--vllm-kv-remember-mib", type=bounded_float(0.0625, 1 << 14), default=8.0, metavar="MIB",
                    help="memory for the block ids the KV ledger remembers (live and evicted hashes, for stable "
                         "ids and recompute detection), allocated at start: 42.7 bytes an id, so the default 8 "
                         "holds 196,608; past it the least recently seen hash is forgotten (counted)")
    vllm = agent.add_argument_group("an unmodified vLLM server (off unless --vllm-url is given)")
    vllm.add_argument("--vllm-url", metavar="URL",
                      help="vLLM's base URL (http://127.0.0.1:8000): its /metrics is scraped and served under "
                           "infersight names; captures use its /start_profile and /stop_profile")
    vllm.add_argument("--vllm-metrics-interval", type=float, default=2.0, metavar="SECONDS",
                      help="seconds between scrapes of vLLM's /metrics (default 2)")
    vllm.add_argument("--vllm-profiler-dir", metavar="DIR",
                      help="vLLM's torch_profiler_dir: captures (infersight capture --steps N) profile vLLM's "
                           "next N steps and analyse the worker's trace from DIR")
    vllm.add_argument("--vllm-capture-wait", type=float, default=60.0, metavar="SECONDS",
                      help="how long a vLLM capture waits for its steps, and then for the trace (default 60)")
    from infersight.commands.agent_recorder import add_recorder_arguments

    add_recorder_arguments(agent)
    agent.set_defaults(func=run)
