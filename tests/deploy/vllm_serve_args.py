"""Run by vLLM's Python (not ours): parse command lines with the parser `vllm serve` builds, then
turn them into engine arguments as `vllm serve` does, without starting anything.

    .venv-vllm/bin/python tests/deploy/vllm_serve_args.py '[["MODEL", "--port=8000", ...], ...]'

Prints one JSON list, one object per command line: {"ok": true, "kv_events_config": {...},
"otlp_traces_endpoint": ..., "middleware": [...], "port": ..., "model": ...} or {"ok": false,
"error": "..."} (a usage error or a refused value: argparse exits, a config class raises).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys


def parse_one(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(root.add_subparsers(dest="subparser"))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = root.parse_args(["serve", *argv])
            command.validate(args)
            engine = AsyncEngineArgs.from_cli_args(args)
    except SystemExit as exc:  # argparse's usage error
        return {"ok": False, "error": f"exit {exc.code}: {stderr.getvalue().strip()[-500:]}"}
    except Exception as exc:  # noqa: BLE001 (a config class refusing a value: reported, not raised)
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    events = engine.kv_events_config
    return {"ok": True, "model": args.model_tag, "port": args.port, "middleware": list(args.middleware),
            "otlp_traces_endpoint": engine.otlp_traces_endpoint,
            "kv_events_config": dataclasses.asdict(events) if events is not None else None}


if __name__ == "__main__":
    print(json.dumps([parse_one(argv) for argv in json.loads(sys.argv[1])]))
