"""`infersight agent`."""
from __future__ import annotations

import argparse

from infersight.agent.autoapply.config import AutoApplyConfig
from infersight.agent.rings.engine_label_config import EngineLabelConfig
from infersight.agent.gpu_config import GpuConfig
from infersight.agent.rings.limits_config import RecordLimits
from infersight.agent.recorder.config import RecorderConfig
from infersight.agent.rows.retention_config import RetentionConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.sources.vllm.kv_config import VllmKvConfig
from infersight.sources.vllm.http_config import VllmHttpConfig
from infersight.tracing.config import TracingConfig


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


#: The components' config objects built from their own flag groups (each class's add_flags / from_args),
#: by AgentConfig field, in --help order.
GROUPS = (("exposition", ExpositionConfig), ("retention", RetentionConfig), ("limits", RecordLimits),
          ("slow", SlowRequestConfig), ("tracing", TracingConfig), ("gpu", GpuConfig), ("vllm_kv", VllmKvConfig),
          ("vllm_server", VllmHttpConfig), ("flight_recorder", RecorderConfig), ("auto_apply", AutoApplyConfig),
          ("engine_label", EngineLabelConfig))


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    if not args.parquet_dir:  # pyarrow is for Parquet only: about 35 MB less resident (agent/lean_imports.py)
        from infersight.agent.lean_imports import import_pandas_without_pyarrow

        import_pandas_without_pyarrow()
    from infersight.agent.config import AgentConfig
    from infersight.agent.service import Agent

    logging.basicConfig(level=logging.INFO, format="%(asctime)s infersight-agent %(levelname)s %(message)s")
    host, port = parse_listen(args.listen)
    agent = Agent(AgentConfig(rings=args.ring or [], discover=args.discover or bool(args.discover_prefix),
                              discover_prefix=args.discover_prefix or "infersight-", host=host, port=port,
                              max_connections=args.max_connections, poll_interval_s=args.poll_interval,
                              parquet_dir=args.parquet_dir,
                              **{name: group.from_args(args) for name, group in GROUPS}))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run(args.duration)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
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
    agent.add_argument("--duration", type=float, help="stop after this many seconds")
    for _, group in GROUPS:
        group.add_flags(agent)
    agent.set_defaults(func=run)
