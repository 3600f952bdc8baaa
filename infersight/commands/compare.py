"""`infersight compare RUN_A RUN_B`: two runs side by side, B against A."""
from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from infersight.correlate.run_compare import CompareConfig, compare_runs
    from infersight.dashboards.report.compare_inputs import load_compared_run
    from infersight.dashboards.report.compare_page import compare_html, text_table

    a, b = load_compared_run(args.run_a), load_compared_run(args.run_b)
    if a.name == b.name:  # two folders of one name (x/out, y/out): call them by their paths
        a, b = load_compared_run(args.run_a, args.run_a), load_compared_run(args.run_b, args.run_b)
    result = compare_runs(a, b, CompareConfig(seed=args.seed))
    text = (json.dumps(result, indent=2, allow_nan=False) + "\n" if args.format == "json" else
            compare_html(result) if args.format == "html" else text_table(result))
    if args.out:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"{args.out}: cannot write ({exc.strerror})") from None
        print(args.out)
    else:
        print(text, end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="two runs side by side: latency percentiles with bootstrap intervals, "
                                       "phases, prefix cache, KV, expert load, speculation")
    p.add_argument("run_a", metavar="RUN_A", help="a run folder (summary.json, requests.parquet) or a summary JSON file")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared against RUN_A (differences are B - A)")
    p.add_argument("--format", choices=("text", "json", "html"), default="text")
    p.add_argument("--out", metavar="FILE", help="write to FILE (default: standard output)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default 0)")
    p.set_defaults(func=run)
