"""Span attributes: the names backends read, and the functions that fill them from a request row.

Three vocabularies are written side by side so that each backend finds what it looks for:
- OpenTelemetry GenAI semantic conventions (`gen_ai.*`, `error.type`);
- OpenInference (`openinference.span.kind`, `llm.*`, `input.*`/`output.*`, `session.id`, `user.id`),
  which Arize Phoenix reads;
- Langfuse's `langfuse.observation.completion_start_time` (the first token, ISO 8601), from which
  Langfuse computes time to first token.
Our own numbers go under `infersight.*`. Nothing here touches the SDK: values are plain
str/bool/int/float or sequences of them, so the span builder stays pure.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any, Mapping, Sequence, Union

AttrValue = Union[str, bool, int, float, Sequence[str]]
Attributes = dict[str, AttrValue]

PROVIDER = "infersight"
#: Finish reasons that make a request "failed": kept whatever the sampling ratio, span status ERROR.
FAILED_REASONS = frozenset({"abort", "error"})

# -- OpenTelemetry GenAI ------------------------------------------------------------------------------
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_TOP_P = "gen_ai.request.top_p"
GEN_AI_TOP_K = "gen_ai.request.top_k"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_SEED = "gen_ai.request.seed"
GEN_AI_STREAM = "gen_ai.request.stream"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
ERROR_TYPE = "error.type"
# -- OpenInference ------------------------------------------------------------------------------------
OI_SPAN_KIND = "openinference.span.kind"
OI_MODEL = "llm.model_name"
OI_PROVIDER = "llm.provider"
OI_PROMPT_TOKENS = "llm.token_count.prompt"
OI_COMPLETION_TOKENS = "llm.token_count.completion"
OI_TOTAL_TOKENS = "llm.token_count.total"
OI_CACHE_READ = "llm.token_count.prompt_details.cache_read"
OI_INVOCATION = "llm.invocation_parameters"
OI_INPUT = "input.value"
OI_INPUT_MIME = "input.mime_type"
OI_OUTPUT = "output.value"
OI_OUTPUT_MIME = "output.mime_type"
SESSION_ID = "session.id"
USER_ID = "user.id"
# -- Langfuse -----------------------------------------------------------------------------------------
LANGFUSE_COMPLETION_START = "langfuse.observation.completion_start_time"
# -- ours ---------------------------------------------------------------------------------------------
IS = "infersight."
#: Row columns copied as infersight.<column> (units keep their suffix: _s seconds, _j joules). The
#: GPU figures (energy_j, gpu_sm_active_s, gpu_kernel_s) are left out where no GPU measured them.
ROW_MEASURES = ("ttft_s", "queue_s", "prefill_s", "preemption_stall_s", "decode_s", "network_s", "e2e_s",
                "itl_mean_s", "engine_seconds", "energy_j", "gpu_sm_active_s", "gpu_kernel_s")


def iso8601(wall_ns: int) -> str:
    """UTC, microseconds, 'Z' suffix (what Langfuse parses)."""
    sec, ns = divmod(int(wall_ns), 1_000_000_000)
    t = dt.datetime.fromtimestamp(sec, tz=dt.timezone.utc).replace(microsecond=ns // 1000)
    return t.isoformat().replace("+00:00", "Z")


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def invocation_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling parameters as given (None values left out), for llm.invocation_parameters."""
    return {k: v for k, v in params.items() if _finite(v)}


def genai(operation: str, model: str, row: Mapping[str, Any], params: Mapping[str, Any]) -> Attributes:
    """GenAI attributes of a request span. params: temperature, top_p, top_k, max_tokens, seed, stream
    (absent or None for requests that did not come through the server)."""
    out: Attributes = {
        GEN_AI_OPERATION: operation, GEN_AI_PROVIDER: PROVIDER, GEN_AI_REQUEST_MODEL: model,
        GEN_AI_RESPONSE_MODEL: model, GEN_AI_INPUT_TOKENS: int(row["prompt_tokens"]),
        GEN_AI_OUTPUT_TOKENS: int(row["output_tokens"]), GEN_AI_CACHE_READ: int(row["cached_tokens"]),
        GEN_AI_FINISH_REASONS: [str(row["finish_reason"])],
    }
    for key, name in ((GEN_AI_TEMPERATURE, "temperature"), (GEN_AI_TOP_P, "top_p"), (GEN_AI_TOP_K, "top_k"),
                      (GEN_AI_MAX_TOKENS, "max_tokens"), (GEN_AI_SEED, "seed"), (GEN_AI_STREAM, "stream")):
        if _finite(params.get(name)):
            out[key] = params[name]
    if str(row["finish_reason"]) in FAILED_REASONS:
        out[ERROR_TYPE] = str(row["finish_reason"])
    return out


def openinference(model: str, row: Mapping[str, Any], params: Mapping[str, Any]) -> Attributes:
    prompt, completion = int(row["prompt_tokens"]), int(row["output_tokens"])
    return {
        OI_SPAN_KIND: "LLM", OI_MODEL: model, OI_PROVIDER: PROVIDER, OI_PROMPT_TOKENS: prompt,
        OI_COMPLETION_TOKENS: completion, OI_TOTAL_TOKENS: prompt + completion,
        OI_CACHE_READ: int(row["cached_tokens"]),
        OI_INVOCATION: json.dumps(invocation_parameters(params), sort_keys=True),
    }


def identity(texts: Mapping[str, str]) -> Attributes:
    """session.id and user.id, when the caller gave them (headers or the body's `user`)."""
    out: Attributes = {}
    if texts.get("session_id"):
        out[SESSION_ID] = texts["session_id"]
    if texts.get("user_id"):
        out[USER_ID] = texts["user_id"]
    return out


def content(operation: str, texts: Mapping[str, str]) -> Attributes:
    """Prompt and completion (only called with content export on at both ends). A chat prompt is
    the JSON of its messages, also spelled out as OpenInference llm.input_messages.*."""
    out: Attributes = {}
    prompt, completion = texts.get("prompt"), texts.get("completion")
    if prompt is not None:
        out[OI_INPUT] = prompt
        out[OI_INPUT_MIME] = "application/json" if operation == "chat" else "text/plain"
        if operation == "chat":
            try:
                messages = json.loads(prompt)
            except ValueError:
                messages = []
            for i, m in enumerate(messages if isinstance(messages, list) else []):
                if isinstance(m, dict):
                    out[f"llm.input_messages.{i}.message.role"] = str(m.get("role", ""))
                    out[f"llm.input_messages.{i}.message.content"] = str(m.get("content", ""))
    if completion is not None:
        out[OI_OUTPUT] = completion
        out[OI_OUTPUT_MIME] = "text/plain"
        if operation == "chat":
            out["llm.output_messages.0.message.role"] = "assistant"
            out["llm.output_messages.0.message.content"] = completion
    return out


def ours(row: Mapping[str, Any], accepted: int, proposed: int) -> Attributes:
    """infersight.*: the decomposition, cost (engine time; energy and GPU time where a GPU measured them),
    preemptions, speculation and slow cause."""
    out: Attributes = {IS + "request_id": int(row["request_id"]), IS + "task": str(row["task"]),
                       IS + "preemptions": int(row["num_preemptions"])}
    for col in ROW_MEASURES:
        if _finite(row.get(col)):
            out[IS + col] = float(row[col])
    if proposed > 0:
        out[IS + "spec.proposed"] = proposed
        out[IS + "spec.accepted"] = accepted
        out[IS + "spec.accept_rate"] = accepted / proposed
    if row.get("slow_cause"):
        out[IS + "slow_cause"] = str(row["slow_cause"])
    return out
