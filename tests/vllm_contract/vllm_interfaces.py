"""Every vLLM interface infersight relies on, as one table (data), checked against each vLLM release.

One row per interface: the vLLM module (``"a|b"``: it lived in a in some releases, b in others, and
we never import it by that path; for literal and metrics rows: look in a and b together), the name in it (``Class``, ``Class.method``, ``function``,
``CONSTANT``), the kind of check, and what we use of it:

    kind          checked                                                      uses
    class         the attributes exist (fields, properties, methods, self.X)   attribute names
    tagged_struct a msgspec Struct, tagged by class name under "type"          field names
    array_struct  a msgspec array_like Struct (fields travel by position)      field names, in order: a prefix
    function      the parameters exist, in this order (others may follow)      parameter names
    constant      its value (compared as repr)                                 (repr of the value,)
    enum_strings  str() of the members includes these                         strings
    literal       these strings occur in the module's source (ast constants)  strings ("x|y": either)
    metrics       a Prometheus metric of that name and type is defined there   "name=counter|gauge|histogram"
    reads         the method reads self.<attribute>                            attribute names

Where our code states what it uses, the row is derived from our code, not copied: the stats fields
from translate.py's Protocols, the KV-event fields from vllm_kv_wire's structs, the metric names from
vllm_metrics.FAMILIES, the launch flags from VllmServerConfig.command(), the stat-logger methods from
InfersightStatLogger's overrides (read with ast: that module imports vLLM), the entry-point groups from
pyproject.toml. The rest is listed by hand, each with the line of our code it comes from.

The table is tests-side on purpose: nothing at runtime needs it, and the plugin must not import it.
"""
from __future__ import annotations

import ast
import json
import tomllib
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec

from infersight.exporters import catalogue as C
from infersight.sources.vllm import kv_wire as wire
from infersight.sources.vllm.metrics import FAMILIES
from infersight.vllm import translate as t
from infersight.vllm.launch import VllmServerConfig
from infersight.vllm.middleware import OPERATIONS, REQUEST_ID_HEADER

REPO_ROOT = Path(__file__).resolve().parents[2]
KINDS = ("class", "tagged_struct", "array_struct", "function", "constant", "enum_strings", "literal", "metrics",
         "reads")


@dataclass(frozen=True)
class Interface:
    module: str
    name: str
    kind: str
    uses: tuple[str, ...]
    used_by: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.module}:{self.name}: unknown kind {self.kind!r}")
        if not self.uses and self.kind not in ("class", "tagged_struct", "function"):
            raise ValueError(f"{self.module}:{self.name}: a {self.kind} row must name what we use")

    @property
    def key(self) -> str:
        return f"{self.module}:{self.name}"


# -- derived from our code ----------------------------------------------------------------------
def protocol_fields(protocol: type) -> tuple[str, ...]:
    return tuple(typing.get_type_hints(protocol, vars(t)).keys())


def struct_fields(struct: type) -> tuple[str, ...]:
    return tuple(f.name for f in msgspec.structs.fields(struct))


def metric_types() -> tuple[str, ...]:
    """"vLLM name=type" for each family vllm_metrics.FAMILIES reads, as vllm_metrics.normalise reads
    it: a histogram where our spec is one or where we serve its count (steps); else a counter when the
    sample ends in _total (vLLM names it without: prometheus_client adds the suffix), else a gauge."""
    out = []
    for sample, fmap in FAMILIES.items():
        if fmap.spec.kind == "histogram" or fmap.spec is C.STEPS:
            out.append(f"{sample}=histogram")
        elif sample.endswith("_total"):
            out.append(f"{sample.removesuffix('_total')}=counter")
        else:
            out.append(f"{sample}=gauge")
    return tuple(out)


def launch_options() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """(flags of `vllm serve` -> dataclass field names they set, JSON option -> its keys) of the
    fullest command VllmServerConfig builds. vLLM makes each flag from a field: --block-size from
    EngineArgs.block_size, --no-enable-prefix-caching from the same boolean field."""
    cmd = VllmServerConfig(model="m", port=1, max_num_seqs=1, kv_events="tcp://127.0.0.1:1",
                           kv_events_replay="tcp://127.0.0.1:2", otlp_traces_endpoint="http://127.0.0.1:3",
                           profiler_dir="/p", profiler_options={"ignore_frontend": True}, middleware=["a.B"],
                           ngram_speculative_tokens=1, served_model_name="s").command(Path("python"))
    args = cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:]
    fields, json_keys = [], {}
    for i, a in enumerate(args):
        if not a.startswith("--"):
            continue
        field = a[2:].removeprefix("no-").replace("-", "_")
        fields.append(field)
        if i + 1 < len(args) and args[i + 1].startswith("{"):
            json_keys[field] = tuple(json.loads(args[i + 1]))
    frontend = tuple(f for f in fields if f in ("host", "port", "middleware"))
    engine = tuple(f for f in fields if f not in frontend)
    return {"frontend": frontend, "engine": engine}, json_keys


def overridden_params(path: Path, cls: str) -> dict[str, tuple[str, ...]]:
    """Method -> its parameter names (without self) in our class ``cls`` of ``path``, read with ast."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {f.name: tuple(a.arg for a in f.args.args[1:]) for f in node.body if isinstance(f, ast.FunctionDef)}


def launch_environment() -> tuple[str, ...]:
    """The VLLM_* variables VllmServerConfig.environment() sets for vLLM (string constants in its source)."""
    tree = ast.parse((REPO_ROOT / "infersight/vllm/launch.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "environment")
    return tuple(sorted({n.value for n in ast.walk(fn) if isinstance(n, ast.Constant)
                         and isinstance(n.value, str) and n.value.startswith("VLLM_")}))


def entry_point_groups() -> tuple[str, ...]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return tuple(g for g in pyproject["project"]["entry-points"] if g.startswith("vllm."))


# -- the table ------------------------------------------------------------------------------------
def interfaces() -> list[Interface]:
    stats, kv = "vllm.v1.metrics.stats", "vllm.distributed.kv_events"
    prom = "vllm.v1.metrics.loggers|vllm.v1.spec_decode.metrics"  # the spec-decode families are made in the latter
    flags, json_keys = launch_options()
    ours = overridden_params(REPO_ROOT / "infersight/vllm/stat_logger.py", "InfersightStatLogger")
    groups = {"vllm.general_plugins": "DEFAULT_PLUGINS_GROUP", "vllm.stat_logger_plugins": "STAT_LOGGER_PLUGINS_GROUP"}
    rows = [
        # the stat logger (infersight/vllm/stat_logger.py, translate.py)
        Interface("vllm.v1.metrics.loggers", "StatLoggerBase", "class",
                  tuple(m for m in ours if not m.startswith("_") and m != "translate"), "vllm/stat_logger.py"),
        *[Interface("vllm.v1.metrics.loggers", f"StatLoggerBase.{m}", "function", ours[m], "vllm/stat_logger.py")
          for m in ("__init__", "record") if ours[m]],
        Interface("vllm.config", "VllmConfig", "class", ("cache_config", "additional_config"),
                  "vllm/stat_logger.py (cache_config), vllm/experts.py (additional_config)"),
        Interface("vllm.config", "CacheConfig", "class", ("block_size", "enable_prefix_caching", "num_gpu_blocks"),
                  "vllm/stat_logger.py"),
        Interface(stats, "SchedulerStats", "class", protocol_fields(t.SchedulerStatsLike), "vllm/translate.py"),
        Interface(stats, "IterationStats", "class", protocol_fields(t.IterationStatsLike), "vllm/translate.py"),
        Interface(stats, "FinishedRequestStats", "class", protocol_fields(t.FinishedRequestStatsLike), "vllm/translate.py"),
        Interface(stats, "PromptTokenStats", "class", protocol_fields(t.PromptTokenStatsLike), "vllm/translate.py"),
        Interface(stats, "PrefixCacheStats", "class", protocol_fields(t.PrefixCacheStatsLike), "vllm/translate.py"),
        Interface(stats, "MultiModalCacheStats", "class", (), "vllm/stat_logger.py (imported)"),
        Interface("vllm.v1.spec_decode.metrics", "SpecDecodingStats", "class", protocol_fields(t.SpecDecodingStatsLike),
                  "vllm/translate.py"),
        Interface(stats, "SchedulerIterationDetails", "class", protocol_fields(t.IterationDetailsLike), "vllm/translate.py"),
        # str(FinishReason) -> translate._FINISH; vllm_metrics.FINISH_REASONS are the label values of vllm:request_success
        Interface("vllm.v1.engine", "FinishReason", "enum_strings", tuple(sorted(t._FINISH)), "vllm/translate.py"),
        # the plugins (pyproject.toml entry points; vLLM loads each group by these names)
        *[Interface("vllm.plugins", groups[g], "constant", (repr(g),), "pyproject.toml") for g in entry_point_groups()],
        # the expert counter (infersight/vllm/experts.py)
        Interface("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner", "class",
                  ("router", "layer_id"), "vllm/experts.py (_moe_runner_router, _bind)"),
        Interface("vllm.model_executor.layers.fused_moe.router.base_router", "BaseRouter", "class",
                  ("set_capture_fn", "capture_fn", "global_num_experts"), "vllm/experts.py (_bind)"),
        Interface("vllm.model_executor.layers.fused_moe.router.base_router", "BaseRouter.set_capture_fn", "function",
                  ("capture_fn",), "vllm/experts.py (_bind)"),
        Interface("vllm.forward_context", "ForwardContext", "class", ("attn_metadata", "is_padding"),
                  "vllm/experts.py (_is_dummy_run)"),
        Interface("vllm.forward_context", "get_forward_context", "function", (), "vllm/experts.py (_is_dummy_run)"),
        Interface("vllm.forward_context", "is_forward_context_available", "function", (), "vllm/experts.py"),
        Interface("vllm.config", "get_current_vllm_config", "function", (), "vllm/experts.py (_mark_compile_cache)"),
        # the compile cache key must include additional_config, or a cached graph ignores our callback
        Interface("vllm.config.vllm", "VllmConfig.compute_hash|VllmConfig.compile_factors", "reads",
                  ("additional_config",), "vllm/experts.py (_mark_compile_cache)"),
        # the KV-event decoder (infersight/sources/vllm/kv_wire.py, vllm_kv_events.py)
        Interface(kv, "BlockStored", "tagged_struct", struct_fields(wire.BlockStored), "sources/vllm/kv_wire.py"),
        Interface(kv, "BlockRemoved", "tagged_struct", struct_fields(wire.BlockRemoved), "sources/vllm/kv_wire.py"),
        Interface(kv, "AllBlocksCleared", "tagged_struct", struct_fields(wire.AllBlocksCleared), "sources/vllm/kv_wire.py"),
        Interface(kv, "KVEventBatch", "array_struct", struct_fields(wire._Batch), "sources/vllm/kv_wire.py"),
        Interface(kv, "ZmqEventPublisher", "class", ("_is_bind_endpoint", "END_SEQ"),
                  "sources/vllm/kv_events.py (subscriber_plan), vllm_kv_wire.py (is_replay_end)"),
        Interface(kv, "ZmqEventPublisher.END_SEQ", "constant", (repr(wire.END_SEQ),), "sources/vllm/kv_wire.py"),
        # the launch command (infersight/vllm/launch.py): every flag is a field of these dataclasses
        Interface("vllm.entrypoints.common.cli_args|vllm.entrypoints.launchers.cli_args", "FrontendArgs", "class",
                  flags["frontend"], "vllm/launch.py"),
        Interface("vllm.engine.arg_utils", "EngineArgs", "class", flags["engine"], "vllm/launch.py"),
        Interface("vllm.envs", "environment_variables", "literal", launch_environment(),
                  "vllm/launch.py (VllmServerConfig.environment)"),
        Interface("vllm.config", "KVEventsConfig", "class", json_keys["kv_events_config"], "vllm/launch.py"),
        Interface("vllm.config", "ProfilerConfig", "class", json_keys["profiler_config"],
                  "vllm/launch.py, sources/vllm/profiler.py"),
        Interface("vllm.config", "SpeculativeConfig", "class", json_keys["speculative_config"], "vllm/launch.py"),
        # the middleware (infersight/vllm/middleware.py, ids.py): the routes it observes, vLLM's request id
        # taken from the X-Request-Id header, and the engine ids built from it (ids._ENGINE_ID)
        Interface("vllm.entrypoints.openai.completion.api_router|vllm.entrypoints.openai.chat_completion.api_router",
                  "router", "literal", tuple(OPERATIONS), "vllm/middleware.py (OPERATIONS)"),
        Interface("vllm.entrypoints.serve.engine.serving", "OpenAIServing._base_request_id", "literal",
                  (f"{REQUEST_ID_HEADER.title()}|{REQUEST_ID_HEADER}",), "vllm/middleware.py (REQUEST_ID_HEADER)"),
        Interface("vllm.entrypoints.scale_out.render.serving", "request ids", "literal", ("cmpl-", "chatcmpl-"),
                  "vllm/ids.py (_ENGINE_ID)"),
        # the scraper (infersight/sources/vllm/metrics.py) and the profiler client (vllm_profiler.py, vllm_trace.py)
        Interface(prom, "PrometheusStatLogger", "metrics", metric_types(), "sources/vllm/metrics.py"),
        Interface(prom, "PrometheusStatLogger labels", "literal", ("finished_reason", "position"),
                  "sources/vllm/metrics.py (_finish, _position)"),
        Interface("vllm.entrypoints.serve.profile.api_router", "/start_profile", "literal",
                  ("/start_profile", "/stop_profile"), "sources/vllm/profiler.py"),
        Interface("vllm.entrypoints.serve.profile.api_router", "StartProfileRequest", "class",
                  ("profile_prefix", "max_iterations"), "sources/vllm/profiler.py (_post /start_profile)"),
        Interface("vllm.v1.worker.gpu_worker", "Worker.annotate_profile", "literal",
                  ("execute_context_", "_generation_"), "sources/vllm/trace.py (_STEP_RANGE)"),
    ]
    return rows


#: A row naming an attribute vLLM never had: every run checks it with the table and must report exactly
#: it missing, so a run that checked nothing (a wrong path, an empty result) cannot pass.
CANARY = Interface("vllm.v1.metrics.loggers", "StatLoggerBase", "class", ("record", "infersight_canary"), "canary")


def as_json(rows: list[Interface]) -> str:
    return json.dumps([asdict(r) for r in rows])
