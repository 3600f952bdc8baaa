"""The `infersight` command line: parse arguments, call a library function, print.

Each subcommand lives in infersight/commands/<name>.py and registers itself here.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import typing

COMMANDS = ("demo", "agent", "bench", "capture", "dashboards", "report", "analyze", "serve", "rules", "mcp", "fleet", "compare", "export_hf")


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage text stays behind --help), exit code 2.
    Subcommand parsers inherit the class (add_subparsers defaults to the parent's type)."""

    def error(self, message: str) -> "typing.NoReturn":
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(prog="infersight", description="Observability for LLM inference engines.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"infersight.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as exc:  # bad input (ConfigError, InvalidRequestError, ...): a message, not a traceback
        print(f"infersight: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
