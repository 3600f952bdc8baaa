"""vLLM's request spans, read: which received spans they are, and what the join needs from them.

vLLM (0.32) exports one childless span per finished request, named `llm_request`, kind SERVER,
parented under the caller's traceparent, from arrival to finish, with (vllm/tracing/utils.py)

    gen_ai.request.id             the engine's external id: "cmpl-<base>-<choice>" or "chatcmpl-<base>"
    gen_ai.request.temperature    (only when non-zero) / top_p / max_tokens / n
    gen_ai.usage.prompt_tokens / completion_tokens, gen_ai.latency.* (seconds)

A span is taken to be a request span when it carries a non-empty string `gen_ai.request.id`:
that is the attribute the join needs, and it survives a renamed span. Everything vLLM-specific
about spans is here; span_join.py only sees EngineRequestSpan.
"""
from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from infersight.tracing.span_join import EngineRequestSpan
from infersight.vllm.ids import key_for_vllm_id

REQUEST_SPAN_NAME = "llm_request"
REQUEST_ID = "gen_ai.request.id"
#: vLLM's sampling attributes -> the parameter names of ServedInfo.params.
PARAMS = {"gen_ai.request.temperature": "temperature", "gen_ai.request.top_p": "top_p",
          "gen_ai.request.max_tokens": "max_tokens"}


def operation_of(vllm_request_id: str) -> str:
    """The GenAI operation of a vLLM request id: chat for "chatcmpl-...", else text_completion."""
    return "chat" if vllm_request_id.startswith("chatcmpl-") else "text_completion"


def vllm_request_span(span: ReadableSpan) -> EngineRequestSpan | None:
    """The request span's join key, operation and sampling parameters; None for any other span."""
    attrs = span.attributes or {}
    request_id = attrs.get(REQUEST_ID)
    if not isinstance(request_id, str) or not request_id:
        return None
    params: dict[str, Any] = {name: attrs[key] for key, name in PARAMS.items()
                              if isinstance(attrs.get(key), (int, float)) and not isinstance(attrs.get(key), bool)}
    if "temperature" not in params and "top_p" in params:
        params["temperature"] = 0.0  # vLLM leaves a zero temperature out (it writes only truthy values)
    return EngineRequestSpan(span, key_for_vllm_id(request_id), operation_of(request_id), params)
