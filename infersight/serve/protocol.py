"""The OpenAI-compatible wire format: request validation and response bodies (no HTTP here).

Supported: POST /v1/completions (one prompt: a string or a list of token ids) and POST
/v1/chat/completions (text messages), with stream, stream_options.include_usage, max_tokens
(max_completion_tokens for chat), temperature, top_p, seed, user, n=1, and the vLLM extensions
top_k and ignore_eos. Anything the engine cannot honour (n > 1, stop sequences, logprobs, tools)
is a 400, not silently ignored. Errors are OpenAI-style: {"error": {message, type, param, code}}.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

from infersight.runtime.errors import InvalidRequestError
from infersight.runtime.sampling import SamplingParams

_ROLES = ("system", "user", "assistant", "tool", "developer")


class APIError(Exception):
    """An HTTP error with an OpenAI-style body; `reason` labels the rejection counter."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, reason: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code, self.reason = status, message, type, param, code, reason

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


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


def _check(cond: bool, param: str, message: str) -> None:
    if not cond:
        raise APIError(400, message, param=param)


_KINDS: dict[str, tuple[type, ...]] = {"string": (str,), "boolean": (bool,), "integer": (int,),
                                      "number": (int, float), "object": (dict,)}


def _opt(body: Mapping[str, Any], key: str, kind: str, default: Any) -> Any:
    """body[key] if present and not null, checked to be of JSON type `kind` (true is no integer)."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, _KINDS[kind]) and (kind == "boolean" or not isinstance(value, bool))
    if ok and kind == "number":
        ok = abs(value) < 1e300 and math.isfinite(value)  # also keeps float() of a huge integer from raising
    _check(ok, key, f"{key} must be a{'n' if kind[0] in 'aeio' else ''} {kind}, got {json.dumps(value)[:40]}")
    return value


def _unsupported(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    _check(n in (None, 1), "n", "only n=1 is supported")
    for key in ("stop", "logprobs", "tools", "logit_bias", "suffix"):
        _check(body.get(key) in (None, False, [], {}), key, f"{key} is not supported by this server")
    _check(body.get("echo") in (None, False), "echo", "echo is not supported by this server")
    best_of = body.get("best_of")
    _check(best_of in (None, 1), "best_of", "only best_of=1 is supported")


def _params(body: Mapping[str, Any], max_tokens: Any, default_max_tokens: int) -> SamplingParams:
    seed = _opt(body, "seed", "integer", None)
    _check(seed is None or 0 <= seed < 2**63, "seed", "seed must be in [0, 2**63)")
    try:
        return SamplingParams(temperature=float(_opt(body, "temperature", "number", 1.0)),
                              top_p=float(_opt(body, "top_p", "number", 1.0)), top_k=_opt(body, "top_k", "integer", -1),
                              max_tokens=max_tokens if max_tokens is not None else default_max_tokens, seed=seed,
                              ignore_eos=_opt(body, "ignore_eos", "boolean", False))
    except InvalidRequestError as exc:
        raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from None


def _common(body: Mapping[str, Any], served_model: str, max_tokens_key: str) -> tuple[str, bool, bool, str | None, Any]:
    model = _opt(body, "model", "string", served_model)
    if model != served_model:
        raise APIError(404, f"the model {model!r} does not exist; this server serves {served_model!r}",
                       param="model", code="model_not_found", reason="unknown_model")
    _unsupported(body)
    stream = _opt(body, "stream", "boolean", False)
    include_usage = bool(_opt(body, "stream_options", "object", {}).get("include_usage", False))
    user = _opt(body, "user", "string", None)
    max_tokens = _opt(body, max_tokens_key, "integer", None)
    if max_tokens is None and max_tokens_key == "max_completion_tokens":
        max_tokens = _opt(body, "max_tokens", "integer", None)
    return model, stream, include_usage, user, max_tokens


def parse_completion(body: Mapping[str, Any], served_model: str, default_max_tokens: int = 16) -> GenerationRequest:
    model, stream, include_usage, user, max_tokens = _common(body, served_model, "max_tokens")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        _check(all(isinstance(t, int) and not isinstance(t, bool) for t in prompt), "prompt",
               "prompt must be a string or a list of token ids (one prompt per request)")
        record = json.dumps(prompt)
    else:
        _check(isinstance(prompt, str), "prompt", "prompt must be a string or a list of token ids")
        record = prompt
    _check(len(prompt) > 0, "prompt", "prompt is empty")
    return GenerationRequest("text_completion", model, prompt, _params(body, max_tokens, default_max_tokens), stream,
                             include_usage, user, record)


def render_chat(messages: list[dict[str, str]]) -> str:
    """The prompt the engine sees: one block per message, then the assistant's turn."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def parse_chat(body: Mapping[str, Any], served_model: str, default_max_tokens: int = 16) -> GenerationRequest:
    model, stream, include_usage, user, max_tokens = _common(body, served_model, "max_completion_tokens")
    raw = body.get("messages")
    _check(isinstance(raw, list) and len(raw) > 0, "messages", "messages must be a non-empty list")
    messages = []
    for i, m in enumerate(raw):
        _check(isinstance(m, dict) and m.get("role") in _ROLES, f"messages[{i}].role",
               f"messages[{i}] needs a role, one of {', '.join(_ROLES)}")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            _check(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content), f"messages[{i}].content", "only text content parts are supported")
            content = "".join(p["text"] for p in content)
        _check(isinstance(content, str), f"messages[{i}].content", f"messages[{i}].content must be a string")
        messages.append({"role": m["role"], "content": content})
    return GenerationRequest("chat", model, render_chat(messages), _params(body, max_tokens, default_max_tokens),
                             stream, include_usage, user, json.dumps(messages, ensure_ascii=False))


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


def chunk_body(req: GenerationRequest, response_id: str, text: str | None, reason: str | None, first: bool,
               use: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE chunk: a text delta, the finish (reason set), or the usage chunk (use set, no choices)."""
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
    return body
