"""Every request field checked at the door, over real HTTP: an OpenAI-style 400 naming the field,
with vLLM's ranges and messages; values at the edge of a range are served. The issue-17 cases
(temperature 1e-40, top_p 1e-46, max_tokens >= 2**32, top_k +-1e30, lone surrogates) are regression
tests, also with five normal requests in flight: the bad one gets its error, the five finish.

Bodies are sent as ASCII JSON (json.dumps escapes a lone surrogate as \\ud800, which is what a
client would put on the wire); expected messages are written out from vLLM's wording."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgi_server import read_until_closed, split_response
from serve_fixtures import MODEL, TINY, Harness, real_server

from infersight.serve.config import ServeConfig

MAX_LEN = TINY.max_seq_len  # 256: the harness engine's max_model_len


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Harness, str]]:
    with Harness(ServeConfig(model_name=MODEL)) as h, real_server(h) as url:
        yield h, url


def send(url: str, body: Any, path: str = "/v1/completions", raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=60)


def error_of(resp: httpx.Response, param: str) -> str:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] is None, err
    return err["message"]


P = {"prompt": "hi", "max_tokens": 2}
BAD: list[tuple[dict[str, Any], str, str]] = [
    # (fields over P, param, the exact message)
    ({"max_tokens": 2**32}, "max_tokens",
     f"max_tokens=4294967296 cannot be greater than max_model_len={MAX_LEN}. Please request fewer output tokens."),
    ({"max_tokens": MAX_LEN + 1}, "max_tokens",
     f"max_tokens={MAX_LEN + 1} cannot be greater than max_model_len={MAX_LEN}. Please request fewer output tokens."),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0."),
    ({"max_tokens": 5.5}, "max_tokens", "max_tokens must be an integer, got 5.5"),
    ({"max_tokens": True}, "max_tokens", "max_tokens must be an integer, got true"),
    ({"top_k": 1e30}, "top_k", "top_k must be at most 2147483647, got 1000000000000000019884624838656."),
    ({"top_k": -1e30}, "top_k", "top_k must be 0 (disable), or at least 1, got -1000000000000000019884624838656."),
    ({"top_k": 2**31}, "top_k", "top_k must be at most 2147483647, got 2147483648."),
    ({"top_k": -2}, "top_k", "top_k must be 0 (disable), or at least 1, got -2."),
    ({"temperature": -0.5}, "temperature", "temperature must be non-negative, got -0.5."),
    ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2], got 2.5."),
    ({"temperature": 10**400}, "temperature", "temperature must be a finite number, got inf."),
    ({"temperature": "hot"}, "temperature", 'temperature must be a number, got "hot"'),
    ({"temperature": False}, "temperature", "temperature must be a number, got false"),
    ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
    ({"top_p": 1.5}, "top_p", "top_p must be in (0, 1], got 1.5."),
    ({"seed": 2**63}, "seed", "seed must be in [-9223372036854775808, 9223372036854775807], got 9223372036854775808."),
    ({"seed": 1.5}, "seed", "seed must be an integer, got 1.5"),
    ({"user": "\ud800"}, "user", "user is not valid Unicode text: a lone surrogate at character 0"),
    ({"user": 7}, "user", "user must be a string, got 7"),
    ({"prompt": "ab\udfff"}, "prompt", "prompt is not valid Unicode text: a lone surrogate at character 2"),
    ({"prompt": [1, -1]}, "prompt",
     "prompt must be a string or a list of token ids (non-negative integers; one prompt per request)"),
    ({"model": "x\ud83d"}, "model", "model is not valid Unicode text: a lone surrogate at character 1"),
    ({"n": 0}, "n", "n must be at least 1, got 0."),
    ({"n": 2}, "n", "only n=1 is supported"),
    ({"n": True}, "n", "n must be an integer, got true"),
    ({"best_of": 3}, "best_of", "only best_of=1 is supported"),
    ({"stop": ""}, "stop", "stop cannot contain an empty string."),
    ({"stop": 5}, "stop", "stop must be a string or a list of strings, got 5"),
    ({"stop": ["\ud800"]}, "stop[0]", "stop[0] is not valid Unicode text: a lone surrogate at character 0"),
    ({"stop": ["\n"]}, "stop", "stop is not supported by this server"),
    ({"presence_penalty": 3}, "presence_penalty", "presence_penalty must be in [-2, 2], got 3.0."),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "frequency_penalty is not supported by this server (only 0)"),
    ({"repetition_penalty": 1.2}, "repetition_penalty", "repetition_penalty is not supported by this server (only 1)"),
    ({"min_p": 2}, "min_p", "min_p must be in [0, 1], got 2.0."),
    ({"min_tokens": -1}, "min_tokens", "min_tokens must be greater than or equal to 0, got -1."),
    ({"logprobs": 2}, "logprobs", "logprobs is not supported by this server"),
    ({"stream": "yes"}, "stream", 'stream must be a boolean, got "yes"'),
    ({"stream_options": {"include_usage": True}}, "stream_options",
     "Stream options can only be defined when `stream=True`."),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage", "include_usage must be a boolean, got 1"),
    ({"ignore_eos": 1}, "ignore_eos", "ignore_eos must be a boolean, got 1"),
]


@pytest.mark.parametrize("fields, param, message", BAD, ids=[f"{p}:{json.dumps(f)[:30]}" for f, p, _ in BAD])
def test_bad_field_is_400_naming_it(served, fields: dict[str, Any], param: str, message: str) -> None:  # noqa: ANN001
    _, url = served
    assert error_of(send(url, {**P, **fields}), param) == message


@pytest.mark.parametrize("literal, value", [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf"), ("1e999", "inf")])
def test_non_finite_numbers_are_400(served, literal: str, value: str) -> None:  # noqa: ANN001
    _, url = served
    for key in ("temperature", "top_p", "frequency_penalty"):
        raw = f'{{"prompt": "hi", "{key}": {literal}}}'.encode()
        assert error_of(send(url, None, raw=raw), key) == f"{key} must be a finite number, got {value}."


def test_chat_fields_are_named_in_the_client_words(served) -> None:  # noqa: ANN001
    _, url = served
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    msg = error_of(send(url, {**chat, "max_completion_tokens": 2**40}, "/v1/chat/completions"), "max_completion_tokens")
    assert msg == (f"max_completion_tokens=1099511627776 cannot be greater than max_model_len={MAX_LEN}. "
                   "Please request fewer output tokens.")
    bad = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\udc00!"}]}
    assert error_of(send(url, bad, "/v1/chat/completions"), "messages[1].content") == \
        "messages[1].content is not valid Unicode text: a lone surrogate at character 0"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}
    assert error_of(send(url, parts, "/v1/chat/completions"), "messages[0].content").startswith(
        "messages[0].content is not valid Unicode text")
    named = {"messages": [{"role": "user", "content": "hi", "name": 3}]}
    assert error_of(send(url, named, "/v1/chat/completions"), "messages[0].name") == "messages[0].name must be a string"


def completion(url: str, **fields: Any) -> dict[str, Any]:
    resp = send(url, {"prompt": "the same prompt", "max_tokens": 6, "ignore_eos": True, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_tiny_temperature_and_top_p_are_greedy(served) -> None:  # noqa: ANN001
    """temperature 1e-40 (below vLLM's 1e-5: greedy) and top_p 1e-46 (keeps only the most likely
    token) give exactly the temperature-0 tokens; before, each failed the whole batch."""
    h, url = served
    greedy = completion(url, temperature=0)["choices"][0]["text"]
    assert completion(url, temperature=1e-40)["choices"][0]["text"] == greedy
    assert completion(url, top_p=1e-46, seed=5)["choices"][0]["text"] == greedy
    assert completion(url, temperature=1e-6, seed=9)["choices"][0]["text"] == greedy
    assert h.counters.snapshot()["failed"] == {"request": 0, "step": 0}


def test_values_at_the_edges_are_served(served) -> None:  # noqa: ANN001
    h, url = served
    for fields in ({"top_k": 2**31 - 1}, {"top_k": 0}, {"top_k": -1}, {"top_k": 1}, {"temperature": 2},
                   {"top_p": 1}, {"seed": -(2**63)}, {"seed": 2**63 - 1}, {"seed": -1}, {"max_tokens": 6.0},
                   {"n": 1, "best_of": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
                    "min_p": 0, "min_tokens": 0, "stop": [], "logprobs": None, "user": "\u00e9\U0001f600"}):
        out = completion(url, **fields)
        assert out["usage"]["completion_tokens"] == 6, (fields, out)
    # prompt + max_tokens past max_model_len is capped, as vLLM does; max_tokens alone is not
    prompt = "x" * 10  # 10 bytes -> 10 tokens (the byte tokenizer)
    out = send(url, {"prompt": prompt, "max_tokens": MAX_LEN, "ignore_eos": True}).json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == MAX_LEN
    h.wait_idle()
    assert h.counters.snapshot()["probe_writes_failed"] == 0


ISSUE_CASES = [{"temperature": 1e-40}, {"top_p": 1e-46}, {"max_tokens": 2**32}, {"top_k": 1e30}, {"top_k": -1e30},
               {"user": "\ud800"}]


@pytest.mark.parametrize("bad", ISSUE_CASES, ids=[json.dumps(b) for b in ISSUE_CASES])
def test_one_bad_request_among_five_in_flight(served, bad: dict[str, Any]) -> None:  # noqa: ANN001
    h, url = served
    normal = {"prompt": "a normal request", "max_tokens": 30, "ignore_eos": True}

    async def go() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            others = [asyncio.ensure_future(c.post("/v1/completions", json={**normal, "seed": i})) for i in range(5)]
            for _ in range(500):  # until all five are in the engine
                if h.loop.pending >= 5:
                    break
                await asyncio.sleep(0.01)
            assert h.loop.pending >= 5
            odd = await c.post("/v1/completions", content=json.dumps({**normal, "max_tokens": 3, **bad}).encode(),
                               headers={"content-type": "application/json"})
            return list(await asyncio.gather(*others)), odd

    before = h.counters.snapshot()
    others, odd = asyncio.run(go())
    assert [r.status_code for r in others] == [200] * 5
    assert [r.json()["usage"]["completion_tokens"] for r in others] == [30] * 5
    if "temperature" in bad or "top_p" in bad:  # valid: served greedily
        assert odd.status_code == 200 and odd.json()["usage"]["completion_tokens"] == 3
    else:
        assert odd.status_code == 400 and odd.json()["error"]["param"] == next(iter(bad))
    h.wait_idle()
    after = h.counters.snapshot()
    assert after["failed"] == before["failed"] and after["probe_writes_failed"] == 0


def test_serve_limits_answer_openai_errors(served) -> None:  # noqa: ANN001
    """The issue's 100,000-deep body (a plain-text RecursionError 500 before), 404 and 405: JSON."""
    h, url = served
    before = h.counters.snapshot()["rejected"].get("json_too_deep", 0)
    deep = send(url, None, raw=b"[" * 100_000)
    assert deep.status_code == 400 and deep.json() == {"error": {
        "message": "request body nests JSON deeper than 64 levels", "type": "invalid_request_error", "param": None,
        "code": "json_too_deep"}}
    assert h.counters.snapshot()["rejected"]["json_too_deep"] == before + 1
    missing = httpx.get(url + "/v1/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"error": {
        "message": "Not Found", "type": "invalid_request_error", "param": None, "code": "not_found"}}
    wrong = httpx.get(url + "/v1/completions", timeout=10)
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_serve_closes_slow_header_connections() -> None:
    with Harness(ServeConfig(model_name=MODEL, header_timeout_s=0.5)) as h, real_server(h) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")
            raw, closed = read_until_closed(sock, 5)
        status, _, body = split_response(raw)
        assert status == 408 and json.loads(body)["error"]["message"] == "request headers not received within 0.5 s"
        assert 0.5 <= closed - start < 2.5
        assert send(url, {"prompt": "still serving", "max_tokens": 1}).status_code == 200
