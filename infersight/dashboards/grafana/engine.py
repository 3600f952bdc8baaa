"""The Engine internals dashboard: what only the engine knows. MoE expert load and imbalance, the
KV cache's states, transitions and block ages, prefix-cache hits, speculative acceptance, and
the step loop itself."""
from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable
from grafana_foundation_sdk.models.dashboard import VariableRefresh, VariableSort

from infersight.dashboards.grafana import promql
from infersight.dashboards.grafana.panels import FULL, HALF, THIRD, PanelKit, Query, base_dashboard
from infersight.dashboards.grafana.variables import filtered
from infersight.exporters import catalogue as C

UID = "infersight-engine"
LAYER_VAR = "layer"
#: Bars in the hottest-pairs panel (the agent's top_hot_pairs default).
HOT_PAIRS = 10


def _layer_variable(kit: PanelKit) -> QueryVariable:
    """$layer: the layers the agent exposes expert series for (or "all" above its series cap)."""
    return (QueryVariable(LAYER_VAR).label("MoE layer").datasource(kit.datasource)
            .query(f"label_values({filtered(C.EXPERT_TOKENS.sample)}, {LAYER_VAR})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.NUMERICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


def _moe(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("MoE routing"))
    d = d.with_panel(kit.timeseries("Expert imbalance per layer", [
        Query(promql.summed(C.MOE_IMBALANCE, by="layer", stat="max_over_mean"), "layer {{layer}} max/mean"),
        Query(promql.summed(C.MOE_IMBALANCE, by="layer", stat="cv"), "layer {{layer}} cv")],
        unit="short", width=HALF, description=C.MOE_IMBALANCE.help + " 1.0 max/mean is perfectly even."))
    # The agent's own top pairs (also above its series cap, where no pair has a series of its own).
    hottest = f"topk({HOT_PAIRS}, {promql.summed(C.HOT_EXPERT_TOKENS, by='layer, expert')})"
    d = d.with_panel(kit.bars("Hottest (layer, expert) pairs", [
        Query(hottest, "layer {{layer}} expert {{expert}}", instant=True)], width=HALF,
        description=f"Tokens routed so far to the {HOT_PAIRS} hottest (layer, expert) pairs. "
                    + C.HOT_EXPERT_TOKENS.help))
    # Full width, repeated per selected layer: Grafana splits the row among up to 4 copies.
    load = promql.rate(C.EXPERT_TOKENS, by="expert", **{LAYER_VAR: f"${LAYER_VAR}"})
    d = d.with_panel(kit.heatmap(f"Expert load, layer ${LAYER_VAR}", [Query(load, "expert {{expert}}")],
                                 unit="short", width=FULL,
                                 description="Tokens routed to each expert per second (one row per expert). "
                                             + C.EXPERT_TOKENS.help)
                     .repeat(LAYER_VAR).repeat_direction("h").max_per_row(4))
    return d


def _kv(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("KV cache"))
    d = d.with_panel(kit.timeseries("KV blocks by state", [
        Query(promql.summed(C.KV_BLOCKS, by="state"), "{{state}}")], width=THIRD, stack=True,
        description=C.KV_BLOCKS.help))
    d = d.with_panel(kit.timeseries("KV cache usage", [Query(C.KV_USAGE.sample, "in use")],
                                    unit="percentunit", width=THIRD, description=C.KV_USAGE.help))
    d = d.with_panel(kit.timeseries("KV block transitions", [
        Query(C.KV_EVENTS.rate(by="event"), "{{event}}")], unit="ops", width=THIRD, description=C.KV_EVENTS.help))
    d = d.with_panel(kit.timeseries("Preemptions and recomputation", [
        Query(C.PREEMPTIONS.rate(by="reason"), "preempted ({{reason}})"),
        Query(C.KV_RECOMPUTED_TOKENS.rate(), "tokens recomputed")], unit="short", width=THIRD,
        description=C.PREEMPTIONS.help + " " + C.KV_RECOMPUTED_TOKENS.help))
    d = d.with_panel(kit.timeseries("KV block ages", [
        Query(C.KV_AGE.quantile(0.5, by="kind"), "p50 {{kind}}"),
        Query(C.KV_AGE.quantile(0.9, by="kind"), "p90 {{kind}}")], unit="s", width=THIRD,
        description=C.KV_AGE.help))
    d = d.with_panel(kit.heatmap("KV block lifetimes", [
        Query(promql.bucket_rate(C.KV_AGE, kind="lifetime"), "{{le}}", heatmap=True)],
        unit="s", width=THIRD, buckets=True, description="Blocks whose content died, per second, by lifetime."))
    return d


def _prefix(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Prefix cache"))
    d = d.with_panel(kit.timeseries("Prefix-cache hit rates", [
        Query(C.PREFIX_HIT.views["token_hit_rate"], "prompt tokens"),
        Query(C.PREFIX_HIT_REQUESTS.views["request_hit_rate"], "requests")], unit="percentunit", width=HALF,
        description="Share of prompt tokens served from cached KV, and share of requests with at least one "
                    "cached block."))
    d = d.with_panel(kit.timeseries("Prompt tokens served from the prefix cache, by task", [
        Query(C.PREFIX_HIT.rate(by="task"), "{{task}}")], unit="short", width=HALF, stack=True))
    return d


def _speculation(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Speculative decoding"))
    d = d.with_panel(kit.timeseries("Acceptance rate by task", [
        Query(C.SPEC_ACCEPTED.views["accept_rate"], "{{task}}")], unit="percentunit", width=THIRD,
        description="Accepted / proposed draft tokens."))
    by = "task, position"
    by_position = promql.ratio(promql.increase(C.SPEC_POSITION_ACCEPTED, by=by),
                               promql.increase(C.SPEC_POSITION_PROPOSED, by=by))
    d = d.with_panel(kit.bars("Acceptance by draft position, over the time range", [
        Query(by_position, "{{task}} #{{position}}", instant=True)], unit="percentunit", width=THIRD,
        max_value=1.0, description="The chance a draft survives to each position of the window."))
    d = d.with_panel(kit.timeseries("Predicted speedup by task", [
        Query(promql.summed(C.SPEC_PREDICTED_SPEEDUP, by="task"), "{{task}}")], unit="x", width=THIRD,
        description=C.SPEC_PREDICTED_SPEEDUP.help + " Below 1, speculation costs more than it saves."))
    return d


def _steps(d: Dashboard, kit: PanelKit) -> Dashboard:
    d = d.with_row(kit.row("Engine steps"))
    d = d.with_panel(kit.timeseries("Step duration", [
        Query(expr, name) for name, expr in sorted(C.STEP_DURATION.views.items())], unit="s", width=THIRD))
    d = d.with_panel(kit.timeseries("Steps per second", [Query(C.STEPS.rate(), "steps")], unit="short",
                                    width=THIRD))
    d = d.with_panel(kit.timeseries("Tokens fed to the model, by kind", [
        Query(C.STEP_TOKENS.rate(by="kind"), "{{kind}}")], unit="short", width=THIRD, stack=True,
        description=C.STEP_TOKENS.help))
    d = d.with_panel(kit.timeseries("Time stalled in garbage collections", [
        Query(C.HOST_PAUSE_SECONDS.rate(by="generation"), "generation {{generation}}")], unit="percentunit",
        width=THIRD, stack=True,
        description="Share of wall-clock time the engine's process stood still in Python's garbage collector "
                    "(seconds per second). " + C.HOST_PAUSE_SECONDS.help))
    return d


def build(kit: PanelKit) -> Dashboard:
    """The Engine internals dashboard's builder, with the $layer variable its heatmap repeats over."""
    d = base_dashboard(UID, "infersight / Engine internals",
                       "MoE routing, KV cache lifecycle, prefix cache and speculative decoding, as the "
                       "engine's probes report them.", kit).with_variable(_layer_variable(kit))
    for section in (_moe, _kv, _prefix, _speculation, _steps):
        d = section(d, kit)
    return d
