"""`infersight rules`: write Prometheus rule files (recording rules, SLO burn-rate and fault alerts)
generated from the metric catalogue, and a PrometheusRule holding the same groups."""
from __future__ import annotations

import argparse

from infersight.commands.numeric_flags import bounded_float


def run(args: argparse.Namespace) -> int:
    from infersight.exporters.rules import RulesConfig, write_rules

    config = RulesConfig(slo_ttft_s=args.slo_ttft_s, slo_itl_s=args.slo_itl_s, slo_e2e_s=args.slo_e2e_s,
                         slo_target=args.slo_target, agent_selector=args.agent_selector)
    for path in write_rules(args.out, config, namespace=args.namespace):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    defaults = _defaults()
    p = sub.add_parser("rules", help="write Prometheus recording and alerting rules (and a PrometheusRule) "
                                     "generated from the metric catalogue")
    p.add_argument("--out", required=True, help="output directory for the rule files")
    seconds = bounded_float(0.0, 86400.0, low_open=True)
    p.add_argument("--slo-ttft-s", type=seconds, default=defaults["slo_ttft_s"], metavar="SECONDS",
                   help=f"time-to-first-token objective; a bucket bound of the TTFT histogram "
                        f"(default {defaults['slo_ttft_s']:g})")
    p.add_argument("--slo-itl-s", type=seconds, default=defaults["slo_itl_s"], metavar="SECONDS",
                   help=f"inter-token latency objective, per token; a bucket bound of the ITL histogram "
                        f"(default {defaults['slo_itl_s']:g})")
    p.add_argument("--slo-e2e-s", type=seconds, default=defaults["slo_e2e_s"], metavar="SECONDS",
                   help=f"end-to-end latency objective; a bucket bound of the e2e histogram "
                        f"(default {defaults['slo_e2e_s']:g})")
    p.add_argument("--slo-target", type=bounded_float(0.5, 0.9999), default=defaults["slo_target"], metavar="RATIO",
                   help=f"share of requests (tokens, for ITL) within each objective over 30 days "
                        f"(default {defaults['slo_target']:g})")
    p.add_argument("--agent-selector", default=defaults["agent_selector"], metavar="MATCHERS",
                   help=f"PromQL label matchers selecting the agent's scrape targets, for the up/absent alerts "
                        f"(default {defaults['agent_selector']})")
    p.add_argument("--namespace", help="metadata.namespace of the PrometheusRule (default: none, kubectl's)")
    p.set_defaults(func=run)


def _defaults() -> dict[str, object]:
    """RulesConfig's defaults, read from the dataclass fields without importing the rule builders."""
    import dataclasses

    from infersight.exporters.rules.config import RulesConfig

    return {f.name: f.default for f in dataclasses.fields(RulesConfig)}
