"""`infersight serve` as an OpenAI client sees it: completions, chat, streaming, models, health; and
its safe handling of bad input: malformed JSON and params, oversized bodies and headers, overload,
malformed traceparent, a sidecar that is not there."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from serve_fixtures import MODEL, Harness, real_server

from infersight.serve.config import ServeConfig

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def harness() -> Harness:
    with Harness(ServeConfig(model_name=MODEL, max_body_bytes=4096)) as h:
        yield h


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def post(h: Harness, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with h.client() as c:
            return await c.post(path, **kwargs)
    return run(go())


def assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def sse_events(text: str) -> list[Any]:
    lines = [line for line in text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), text
    payloads = [line[len("data: "):] for line in lines]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_completion(harness: Harness) -> None:
    resp = post(harness, "/v1/completions", json={"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 6,
                                                   "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len("def add(a, b):") + 1, "completion_tokens": 6, "total_tokens": 21,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert int(resp.headers["x-infersight-request-id"]) >= 0
    assert len(resp.headers["x-infersight-trace-id"]) == 32


def test_chat_and_token_ids(harness: Harness) -> None:
    chat = post(harness, "/v1/chat/completions", json={
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text",
                                                                                             "text": "hi"}]}],
        "max_completion_tokens": 3, "ignore_eos": True, "seed": 7})
    assert chat.status_code == 200, chat.text
    assert chat.json()["object"] == "chat.completion"
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert chat.json()["usage"]["completion_tokens"] == 3
    ids = post(harness, "/v1/completions", json={"prompt": [256, 104, 105], "max_tokens": 2, "ignore_eos": True})
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 3


def test_streaming_chat_and_completion(harness: Harness) -> None:
    resp = post(harness, "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "stream please"}], "max_tokens": 5, "stream": True,
        "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    chunks = sse_events(resp.text)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    # The streamed text is the non-streamed one (greedy, same prompt).
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    same = post(harness, "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "stream please"}], "max_tokens": 5, "ignore_eos": True,
        "temperature": 0})
    assert same.json()["choices"][0]["message"]["content"] == text
    comp = post(harness, "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True,
                                                   "ignore_eos": True})
    chunks = sse_events(comp.text)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and all(c["object"] == "text_completion"
                                                                        for c in chunks)


def test_async_scheduling_streams_what_the_synchronous_server_answers(harness: Harness) -> None:
    prompts = ["first of four", "second", "the third prompt is longer than the others", "4"]

    async def streams(h: Harness) -> list[str]:
        async with h.client() as c:
            resps = await asyncio.gather(*(c.post("/v1/completions", json={
                "prompt": p, "max_tokens": 12 + 3 * i, "stream": True, "ignore_eos": True, "temperature": 0})
                for i, p in enumerate(prompts)))
        texts = []
        for r in resps:
            chunks = sse_events(r.text)
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            texts.append("".join(c["choices"][0]["text"] for c in chunks))
        return texts

    with Harness(ServeConfig(model_name=MODEL), async_scheduling=True) as fast:
        got = run(streams(fast))
        harness.wait_idle()
        ahead = fast.engine.steps_launched_ahead
    want = [post(harness, "/v1/completions", json={"prompt": p, "max_tokens": 12 + 3 * i, "ignore_eos": True,
                                                   "temperature": 0}).json()["choices"][0]["text"]
            for i, p in enumerate(prompts)]
    assert got == want and ahead > 0


def test_models_health_metrics(harness: Harness) -> None:
    async def go() -> tuple[httpx.Response, ...]:
        async with harness.client() as c:
            return await c.get("/v1/models"), await c.get("/health"), await c.get("/metrics")
    models, health, metrics = run(go())
    assert models.json()["data"][0]["id"] == MODEL
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert "infersight_server_requests_rejected_total" in metrics.text


def test_invalid_json_is_400_openai_style(harness: Harness) -> None:
    err = assert_openai_error(post(harness, "/v1/completions", content=b'{"prompt": ',
                                   headers={"content-type": "application/json"}), 400)
    assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
    assert_openai_error(post(harness, "/v1/completions", json=["not", "an", "object"]), 400)


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "stop": ["\n"]}, "stop"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x" * 300}, "prompt"),  # longer than the model's max_seq_len: the engine refuses it
])
def test_invalid_params_are_400(harness: Harness, body: dict[str, Any], param: str) -> None:
    err = assert_openai_error(post(harness, "/v1/completions", json=body), 400)
    assert err["param"] == param


def test_bad_chat_messages_and_unknown_model(harness: Harness) -> None:
    assert_openai_error(post(harness, "/v1/chat/completions", json={"messages": []}), 400)
    assert_openai_error(post(harness, "/v1/chat/completions", json={"messages": [{"role": "robot",
                                                                                 "content": "x"}]}), 400)
    err = assert_openai_error(post(harness, "/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404)
    assert err["code"] == "model_not_found"


def test_oversized_body_is_413(harness: Harness) -> None:
    big = {"prompt": "x" * 5000}
    assert_openai_error(post(harness, "/v1/completions", json=big), 413)

    async def chunked() -> httpx.Response:  # no content-length: counted as it arrives
        async def body():
            for _ in range(10):
                yield b"x" * 1000
        async with harness.client() as c:
            return await c.post("/v1/completions", content=body())
    assert_openai_error(run(chunked()), 413)
    assert harness.counters.snapshot()["rejected"]["body_too_large"] >= 2


def test_malformed_traceparent_starts_a_new_trace_and_is_counted(harness: Harness) -> None:
    before = harness.counters.snapshot()["traceparent_invalid"]
    bad = post(harness, "/v1/completions", json={"prompt": "x", "max_tokens": 1},
               headers={"traceparent": "00-not-a-trace-01"})
    assert bad.status_code == 200
    good = post(harness, "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                headers={"traceparent": TRACEPARENT})
    assert good.headers["x-infersight-trace-id"] == TRACEPARENT.split("-")[1]
    assert bad.headers["x-infersight-trace-id"] not in ("0" * 32, TRACEPARENT.split("-")[1])
    assert harness.counters.snapshot()["traceparent_invalid"] == before + 1


def test_overload_is_429_with_retry_after() -> None:
    with Harness(ServeConfig(model_name=MODEL), max_pending=2) as h:
        async def go() -> list[httpx.Response]:
            async with h.client() as c:
                reqs = [c.post("/v1/completions", json={"prompt": f"p{i}", "max_tokens": 40, "ignore_eos": True})
                        for i in range(6)]
                return await asyncio.gather(*reqs)
        resps = run(go())
        codes = sorted(r.status_code for r in resps)
        assert codes.count(200) >= 2 and 429 in codes and set(codes) <= {200, 429}, codes
        limited = next(r for r in resps if r.status_code == 429)
        assert limited.headers["retry-after"] == "1"
        assert limited.json()["error"]["type"] == "rate_limit_error"
        # Once drained, requests are admitted again.
        again = post(h, "/v1/completions", json={"prompt": "after", "max_tokens": 2})
        assert again.status_code == 200 and h.loop.pending == 0


def test_sidecar_unreachable_server_keeps_serving() -> None:
    """Nobody reads the ring (no agent): it fills, the probes drop and count, requests keep working."""
    with Harness(ServeConfig(model_name=MODEL), ring_capacity=64) as h:
        for i in range(6):
            resp = post(h, "/v1/completions", json={"prompt": f"request {i}", "max_tokens": 8, "ignore_eos": True})
            assert resp.status_code == 200, resp.text
        h.wait_idle()
        assert h.probe.ring.stats()["dropped"] > 0


def test_real_uvicorn_limits_headers_and_serves() -> None:
    with Harness(ServeConfig(model_name=MODEL, max_header_bytes=2048)) as h, real_server(h) as url:
        ok = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200, ok.text
        huge = httpx.post(url + "/v1/completions", json={"prompt": "hi"}, headers={"x-big": "y" * 8192}, timeout=30)
        assert huge.status_code in (400, 431)  # h11 refuses it before the app; the app's own check says 431
        with httpx.stream("POST", url + "/v1/completions", timeout=30, json={
                "prompt": "stream", "max_tokens": 4, "stream": True, "ignore_eos": True}) as resp:
            text = "".join(resp.iter_text())
        assert resp.status_code == 200 and text.rstrip().endswith("data: [DONE]")


def test_app_header_limit_is_431() -> None:
    small = Harness(ServeConfig(model_name=MODEL, max_header_bytes=512))
    try:
        resp = post(small, "/v1/completions", json={"prompt": "x"}, headers={"x-big": "y" * 1024})
        assert_openai_error(resp, 431)
    finally:
        small.close()


def test_engine_failure_is_500_and_the_server_keeps_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    with Harness(ServeConfig(model_name=MODEL)) as h:
        real_step, calls = h.engine.step, []

        def flaky() -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("kernel exploded")
            return real_step()

        monkeypatch.setattr(h.engine, "step", flaky)
        err = assert_openai_error(post(h, "/v1/completions", json={"prompt": "boom", "max_tokens": 3}), 500)
        assert err["type"] == "server_error" and "kernel exploded" in err["message"]
        assert post(h, "/v1/completions", json={"prompt": "fine", "max_tokens": 3}).status_code == 200
        assert h.loop.alive and h.loop.pending == 0


def test_continuous_usage_counts_every_token_once(harness: Harness) -> None:
    """vLLM's stream_options.continuous_usage_stats: each chunk's usage so far; the rises add up to the
    completion tokens, which the non-streamed answer of the same greedy request reports too."""
    body = {"prompt": "count me", "max_tokens": 7, "stream": True, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = sse_events(post(harness, "/v1/completions", json=body).text)
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 7
    plain = post(harness, "/v1/completions", json={**body, "stream": False, "stream_options": None}).json()["usage"]
    assert plain["completion_tokens"] == 7
    assert all(c["usage"]["prompt_tokens"] == plain["prompt_tokens"]
               and c["usage"]["total_tokens"] == plain["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in chunks)
    # without include_usage the extension is off: no usage on the text chunks
    off = sse_events(post(harness, "/v1/completions", json={
        **body, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}).text)
    assert all("usage" not in c for c in off)
