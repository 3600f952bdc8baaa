"""The template variables every infersight dashboard carries, and the filter that puts them on every
query, so one dashboard serves one node or a whole fleet.

    $datasource  which Prometheus (a Thanos Query or Mimir endpoint as well): the provisioned one by default
    $namespace   the Kubernetes namespace   (a scrape target label: relabelled from the pod's namespace)
    $node        the node                   (an agent-mode Prometheus's external label, `node`, per node)
    $pod         the pod                    (a scrape target label in Kubernetes)
    $model       the served model           (model_name: the agent's identity label on engine families)
    $instance    the engine's agent target  (instance: HOST:PORT of the agent serving that engine's series)

Each variable lists the values its label has on the series the agents really export: the target
labels from target_info (every agent serves it, and every scrape puts its target labels on it),
the model and instance from the engine's step counter. Each is chained on the ones before it (a
namespace narrows the nodes listed). All of them are multi-value with "All" meaning the regex
`.*`, which also matches a series without that label: a one-node Prometheus has no `node` label,
a loopback fleet no namespace, and their dashboards still show everything under "All".

`filtered` adds the matchers to every catalogue series an expression names. model_name is matched
only on the families that carry it (catalogue identity_labels), so choosing a model does not blank
the GPU or kernel panels, whose series have no model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, QueryVariable
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh, VariableSort

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec

DATASOURCE_VAR = "datasource"
#: "All": the regex matching every value, and the absence of the label.
ALL_VALUE = ".*"


@dataclass(frozen=True)
class FilterVariable:
    """name: the variable ($name); label: the series label it matches; title: shown in Grafana;
    model_only: matched only on families carrying the model identity label."""

    name: str
    label: str
    title: str
    model_only: bool = False


#: In the order Grafana shows them and each narrows the next.
FILTERS = (
    FilterVariable("namespace", "namespace", "Namespace"),
    FilterVariable("node", "node", "Node"),
    FilterVariable("pod", "pod", "Pod"),
    FilterVariable("model", C.MODEL_LABEL, "Model", model_only=True),
    FilterVariable("instance", "instance", "Engine instance (agent target)"),
    # One agent reading several rings labels each engine's series (agent/rings/engine_scope.py); with one
    # ring there is no such label, and All (.*) matches its absence.
    FilterVariable("engine", "engine", "Engine (one agent, several rings)", model_only=True),
)
#: The target labels are read off target_info; the model, instance and engine off the engine's steps.
_TARGET_SOURCE, _ENGINE_SOURCE = C.TARGET_INFO, C.STEPS


def _series_specs() -> dict[str, MetricSpec]:
    """Every series name a dashboard may query -> its catalogue entry (histograms' three series)."""
    out: dict[str, MetricSpec] = {}
    for spec in (*C.CATALOGUE, *C.IDENTITY_METRICS):
        out[spec.sample] = spec
        if spec.kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                out[spec.name + suffix] = spec
    return out


_SPECS = _series_specs()
_SELECTOR = re.compile(r"(?<![\w:])(" + "|".join(re.escape(n) for n in sorted(_SPECS, key=len, reverse=True))
                       + r")(?![\w:])(\{[^}]*\})?")


def _matchers(spec: MetricSpec, filters: tuple[FilterVariable, ...]) -> list[str]:
    has_model = C.MODEL_LABEL in spec.exposed_labels
    return [f'{f.label}=~"${f.name}"' for f in filters if has_model or not f.model_only]


def filtered(expr: str, filters: tuple[FilterVariable, ...] = FILTERS) -> str:
    """expr with the variables' matchers on each catalogue series it names (before its own)."""
    def add(m: re.Match[str]) -> str:
        own = m.group(2)[1:-1].strip() if m.group(2) else ""
        inner = ", ".join([*_matchers(_SPECS[m.group(1)], filters), *([own] if own else [])])
        return f"{m.group(1)}{{{inner}}}" if inner else m.group(1)
    return _SELECTOR.sub(add, expr)


def datasource_variable(uid: str) -> DatasourceVariable:
    """$datasource: any Prometheus datasource, the provisioned one (by uid) selected by default."""
    return (DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")
            .current(VariableOption(selected=True, text=uid, value=uid)))


def filter_variables(datasource: DataSourceRef) -> list[QueryVariable]:
    """The filter variables, each listing its label's values under the variables before it."""
    out = []
    for i, f in enumerate(FILTERS):
        source = _ENGINE_SOURCE if f.name in ("model", "instance", "engine") else _TARGET_SOURCE
        query = f"label_values({filtered(source.sample, FILTERS[:i])}, {f.label})"
        out.append(QueryVariable(f.name).label(f.title).datasource(datasource).query(query)
                   .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
                   .multi(True).include_all(True).all_value(ALL_VALUE)
                   .current(VariableOption(selected=True, text="All", value="$__all")))
    return out
