"""The OpenAI-compatible wire format: request validation and response bodies (no HTTP here).

Supported: POST /v1/completions (one prompt: a string or a list of token ids) and POST
/v1/chat/completions (text messages), with stream, stream_options.include_usage, max_tokens
(max_completion_tokens for chat), temperature, top_p, seed, user, n=1, and the vLLM extensions
top_k, ignore_eos and stream_options.continuous_usage_stats (the usage so far in every chunk: a
chunk may carry several tokens when the server's event loop fell behind the engine). Anything the
engine cannot honour (n > 1, stop sequences, logprobs, tools, penalties other than neutral) is a 400, not silently ignored; unknown fields are ignored, as vLLM
does. Every field is checked at the door, with vLLM's ranges and messages (runtime.engine.request's
checked_sampling_fields): a value the sampler or the probe records could not take never reaches
the engine. Errors are OpenAI-style: {"error": {message, type, param, code}}.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from infersight.runtime.errors import InvalidRequestError
from infersight.runtime.engine.request import InvalidParamError, checked_sampling_fields
from infersight.runtime.engine.sampling import SamplingParams
from infersight.serve import fields as F
from infersight.serve.api_error import APIError
from infersight.serve.fields import check

__all__ = ["APIError", "GenerationRequest", "parse_completion", "parse_chat", "render_chat", "chat_renderer", "usage",
           "response_body", "chunk_body", "finish_reason"]

_ROLES = ("system", "user", "assistant", "tool", "developer")
_NO_MODEL_LIMIT = 1 << 62  # when the caller does not say (the engine checks again at admission)


@dataclass
class GenerationRequest:
    """A validated request. prompt_record: what --export-content would put on the span (the chat
    messages as JSON, or the completion prompt)."""

    operation: str  # chat | text_completion
    model: str
    prompt: str | list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    user: str | None
    prompt_record: str
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): usage in every chunk


def _unsupported(body: Mapping[str, Any]) -> None:
    """Fields the engine has no use for other than their neutral value: type- and range-checked."""
    for key in ("n", "best_of"):
        n = F.integer(body, key, 1)
        check(n >= 1, key, f"{key} must be at least 1, got {n}.")
        check(n == 1, key, f"only {key}=1 is supported")
    check(not F.strings(body, "stop"), "stop", "stop is not supported by this server")
    check(not F.optional(body, "stop_token_ids", "array", []), "stop_token_ids",
          "stop_token_ids is not supported by this server")
    logprobs = body.get("logprobs")
    check(logprobs is None or logprobs is False or (type(logprobs) is int and logprobs == 0), "logprobs",
          "logprobs is not supported by this server")
    check(body.get("top_logprobs") in (None, 0), "top_logprobs", "top_logprobs is not supported by this server")
    for key, kind in (("tools", "array"), ("logit_bias", "object"), ("suffix", "string")):
        check(not F.optional(body, key, kind, None), key, f"{key} is not supported by this server")
    check(not F.optional(body, "echo", "boolean", False), "echo", "echo is not supported by this server")
    for key in ("presence_penalty", "frequency_penalty"):
        F.in_range(body, key, -2.0, 2.0, 0.0)
    F.in_range(body, "repetition_penalty", 0.0, 1e300, 1.0)
    F.in_range(body, "min_p", 0.0, 1.0, 0.0)
    min_tokens = F.integer(body, "min_tokens", 0)
    check(min_tokens >= 0, "min_tokens", f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    check(min_tokens == 0, "min_tokens", "min_tokens is not supported by this server")
    fmt = F.optional(body, "response_format", "object", {})
    check(fmt.get("type", "text") == "text", "response_format", "only response_format type text is supported")


def _params(body: Mapping[str, Any], max_tokens: int | None, max_tokens_key: str, default_max_tokens: int,
            max_model_len: int) -> SamplingParams:
    try:
        checked = checked_sampling_fields(
            F.number(body, "temperature", 1.0), F.number(body, "top_p", 1.0), F.integer(body, "top_k", -1),
            max_tokens if max_tokens is not None else min(default_max_tokens, max_model_len),
            F.integer(body, "seed", None), max_model_len)
        return SamplingParams(**checked, ignore_eos=F.optional(body, "ignore_eos", "boolean", False))
    except InvalidParamError as exc:
        if exc.param == "max_tokens":  # say it in the client's words
            raise APIError(400, str(exc).replace("max_tokens", max_tokens_key), param=max_tokens_key) from None
        raise APIError(400, str(exc), param=exc.param) from None
    except InvalidRequestError as exc:  # SamplingParams' own checks, if stricter
        raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from None


def _common(body: Mapping[str, Any], served_model: str, max_tokens_key: str
            ) -> tuple[str, bool, bool, str | None, int | None, str, bool]:
    model = F.optional(body, "model", "string", served_model)
    if model != served_model:
        raise APIError(404, f"the model {F.show(model)} does not exist; this server serves {served_model!r}",
                       param="model", code="model_not_found", reason="unknown_model")
    _unsupported(body)
    stream = F.optional(body, "stream", "boolean", False)
    options = F.optional(body, "stream_options", "object", None)
    check(options is None or stream, "stream_options", "Stream options can only be defined when `stream=True`.")
    include_usage = F.optional(options or {}, "include_usage", "boolean", False)
    # vLLM's extension: with include_usage, every chunk also carries the usage so far
    continuous = F.optional(options or {}, "continuous_usage_stats", "boolean", False) and include_usage
    user = F.optional(body, "user", "string", None)
    key = max_tokens_key
    max_tokens = F.integer(body, key, None)
    if max_tokens is None and max_tokens_key == "max_completion_tokens":
        key, max_tokens = "max_tokens", F.integer(body, "max_tokens", None)
    return model, stream, include_usage, user, max_tokens, key, continuous


def _token_ids(value: list[Any]) -> list[int]:
    check(all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value), "prompt",
          "prompt must be a string or a list of token ids (non-negative integers; one prompt per request)")
    return value


def parse_completion(body: Mapping[str, Any], served_model: str, default_max_tokens: int = 16,
                     max_model_len: int = _NO_MODEL_LIMIT) -> GenerationRequest:
    model, stream, include_usage, user, max_tokens, key, continuous = _common(body, served_model, "max_tokens")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        prompt = _token_ids(prompt)
        record = json.dumps(prompt)
    else:
        check(isinstance(prompt, str), "prompt", "prompt must be a string or a list of token ids")
        record = F.utf8(prompt, "prompt")
    check(len(prompt) > 0, "prompt", "prompt is empty")
    return GenerationRequest("text_completion", model, prompt,
                             _params(body, max_tokens, key, default_max_tokens, max_model_len), stream,
                             include_usage, user, record, continuous)


def render_chat(messages: list[dict[str, str]]) -> str:
    """The prompt the engine sees: one block per message, then the assistant's turn."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def _message(i: int, m: Any) -> dict[str, str]:
    check(isinstance(m, dict) and m.get("role") in _ROLES, f"messages[{i}].role",
          f"messages[{i}] needs a role, one of {', '.join(_ROLES)}")
    param = f"messages[{i}].content"
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        check(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                  for p in content), param, "only text content parts are supported")
        content = "".join(p["text"] for p in content)
    check(isinstance(content, str), param, f"messages[{i}].content must be a string")
    name = m.get("name")
    check(name is None or isinstance(name, str), f"messages[{i}].name", f"messages[{i}].name must be a string")
    F.utf8(name or "", f"messages[{i}].name")
    return {"role": m["role"], "content": F.utf8(content, param)}


def chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, str]]], str | list[int]]:
    """The engine tokenizer's chat_prompt (a Hugging Face checkpoint's chat template, rendered and
    tokenized), else render_chat for the byte tokenizer of the named configs."""
    return getattr(tokenizer, "chat_prompt", render_chat)


def parse_chat(body: Mapping[str, Any], served_model: str, default_max_tokens: int = 16,
               max_model_len: int = _NO_MODEL_LIMIT,
               render: Callable[[list[dict[str, str]]], str | list[int]] = render_chat) -> GenerationRequest:
    model, stream, include_usage, user, max_tokens, key, continuous = _common(body, served_model,
                                                                              "max_completion_tokens")
    raw = body.get("messages")
    check(isinstance(raw, list) and len(raw) > 0, "messages", "messages must be a non-empty list")
    messages = [_message(i, m) for i, m in enumerate(raw)]
    try:
        prompt = render(messages)
    except InvalidRequestError as exc:  # the template refused these messages (raise_exception)
        raise APIError(400, str(exc), param="messages") from None
    return GenerationRequest("chat", model, prompt,
                             _params(body, max_tokens, key, default_max_tokens, max_model_len),
                             stream, include_usage, user, json.dumps(messages, ensure_ascii=False), continuous)


# -- responses -----------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def finish_reason(engine_reason: str | None) -> str:
    """OpenAI's names: the engine's stop and length are theirs; an abort only reaches gone clients."""
    return engine_reason if engine_reason in ("stop", "length") else "stop"


def response_body(req: GenerationRequest, response_id: str, text: str, reason: str | None,
                  use: dict[str, Any]) -> dict[str, Any]:
    created = int(time.time())
    if req.operation == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason(reason)}
        return {"id": response_id, "object": "chat.completion", "created": created, "model": req.model,
                "choices": [choice], "usage": use}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(reason)}
    return {"id": response_id, "object": "text_completion", "created": created, "model": req.model,
            "choices": [choice], "usage": use}


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """continuous_usage_stats' usage in a text or finish chunk (vLLM's three counts)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk_body(req: GenerationRequest, response_id: str, text: str | None, reason: str | None, first: bool,
               use: dict[str, Any] | None = None, running: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE chunk: a text delta, the finish (reason set), or the usage chunk (use set, no choices);
    running: the usage so far, on a text or finish chunk (continuous_usage_stats)."""
    created = int(time.time())
    if req.operation == "chat":
        obj = "chat.completion.chunk"
        choices: list[dict[str, Any]] = []
        if use is None:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text:
                delta["content"] = text
            choices = [{"index": 0, "delta": delta, "logprobs": None,
                        "finish_reason": finish_reason(reason) if reason else None}]
    else:
        obj = "text_completion"
        choices = [] if use is not None else [{"index": 0, "text": text or "", "logprobs": None,
                                                "finish_reason": finish_reason(reason) if reason else None}]
    body: dict[str, Any] = {"id": response_id, "object": obj, "created": created, "model": req.model,
                            "choices": choices}
    if use is not None:
        body["usage"] = use
    elif running is not None:
        body["usage"] = running
    return body
