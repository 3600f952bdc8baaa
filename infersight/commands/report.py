"""`infersight report`: one self-contained HTML file from a run's output directory."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from infersight.dashboards.report import write_report

    print(write_report(args.out_dir))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write OUT_DIR/report.html from requests.parquet, events/ and summary.json")
    p.add_argument("out_dir", help="a directory written by `infersight demo` or `infersight agent --parquet-dir`")
    p.set_defaults(func=run)
