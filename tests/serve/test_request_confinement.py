"""A failure inside one request (its sampling, probes or KV commit) is confined to it: that request
gets a 500 (or an error event on its stream), the others in the batch finish with every token, the
failure is counted (infersight_server_requests_failed_total{scope="request"}), and the server
keeps serving. Faults are injected for one chosen request id only, over real HTTP; a sampling
fault fails the batched draw (the engine then samples request by request) and the victim's own."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serve_fixtures import MODEL, Harness, real_server

from infersight.runtime.engine import step_rows as engine_module  # the rows' sample, sample_batch and verify
from infersight.serve.config import ServeConfig

NORMAL = {"prompt": "a normal request", "max_tokens": 24, "ignore_eos": True}


@pytest.fixture()
def served() -> Iterator[tuple[Harness, str]]:
    with Harness(ServeConfig(model_name=MODEL)) as h, real_server(h) as url:
        yield h, url


def poison(h: Harness, monkeypatch: pytest.MonkeyPatch, where: str, victim: int) -> None:
    """Make `where` raise for request `victim` only, once it has produced a token or two."""
    if where == "sampling":  # the batched draw fails, then the victim's own draw does
        real_sample = engine_module.sample

        def failing_batch(*args: Any, **kwargs: Any) -> Any:
            req = h.engine.requests.get(victim)
            if req is not None and len(req.output_token_ids) >= 2:
                raise RuntimeError("injected sampling fault")
            return real_batch(*args, **kwargs)

        def failing_sample(probs: Any, generator: Any) -> int:
            req = h.engine.requests.get(victim)
            if req is not None and generator is req.generator and len(req.output_token_ids) >= 2:
                raise RuntimeError("injected sampling fault")
            return real_sample(probs, generator)

        real_batch = engine_module.sample_batch
        monkeypatch.setattr(engine_module, "sample_batch", failing_batch)
        monkeypatch.setattr(engine_module, "sample", failing_sample)
        return
    if where == "probe":  # the step's one call raises (recording none), then the victim's own
        target, name = h.probe, "on_tokens_emitted"
        real_many = h.probe.on_tokens_emitted_many

        def failing_many(request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
            req = h.engine.requests.get(victim)
            if victim in request_ids and req is not None and len(req.output_token_ids) >= 2:
                raise RuntimeError("injected probe fault")
            real_many(request_ids, t_ns, num_tokens)

        monkeypatch.setattr(h.probe, "on_tokens_emitted_many", failing_many)
    else:
        target, name = h.engine.kv, "commit"
    real = getattr(target, name)

    def hooked(*args: Any, **kwargs: Any) -> Any:
        first = args[0]
        rid = first if isinstance(first, int) else first.request_id
        req = h.engine.requests.get(rid)
        if rid == victim and req is not None and len(req.output_token_ids) >= 2:
            raise RuntimeError(f"injected {where} fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, hooked)


async def batch(url: str, stream_victim: bool) -> tuple[list[httpx.Response], httpx.Response | str]:
    """Five normal requests and, sent third (request id 2), the victim; all in flight together."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        async def victim() -> httpx.Response | str:
            body = {**NORMAL, "seed": 99, "stream": stream_victim}
            if not stream_victim:
                return await c.post("/v1/completions", json=body)
            async with c.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                return "".join([chunk async for chunk in resp.aiter_text()])

        tasks = [asyncio.ensure_future(c.post("/v1/completions", json={**NORMAL, "seed": i})) for i in range(2)]
        await asyncio.sleep(0.05)
        odd = asyncio.ensure_future(victim())
        await asyncio.sleep(0.05)
        tasks += [asyncio.ensure_future(c.post("/v1/completions", json={**NORMAL, "seed": i})) for i in range(2, 5)]
        return list(await asyncio.gather(*tasks)), await odd


@pytest.mark.parametrize("where", ["sampling", "probe", "commit"])
def test_failure_is_confined_to_its_request(served, monkeypatch: pytest.MonkeyPatch, where: str) -> None:  # noqa: ANN001
    h, url = served
    assert httpx.post(url + "/v1/completions", json={"prompt": "warm", "max_tokens": 1}).status_code == 200  # id 0
    poison(h, monkeypatch, where, victim=3)  # ids: 1, 2 normal, 3 the victim, 4-6 normal
    others, odd = asyncio.run(batch(url, stream_victim=False))
    assert [r.status_code for r in others] == [200] * 5
    assert [r.json()["usage"]["completion_tokens"] for r in others] == [24] * 5
    assert sorted(int(r.headers["x-infersight-request-id"]) for r in others) == [1, 2, 4, 5, 6]
    assert isinstance(odd, httpx.Response) and odd.status_code == 500
    assert odd.json() == {"error": {"message": f"the engine failed this request: RuntimeError: injected {where} fault",
                                    "type": "server_error", "param": None, "code": None}}
    assert h.counters.snapshot()["failed"] == {"request": 1, "step": 0}
    metrics = httpx.get(url + "/metrics").text
    assert 'infersight_server_requests_failed_total{scope="request"} 1.0' in metrics
    assert 'infersight_server_requests_failed_total{scope="step"} 0.0' in metrics
    h.wait_idle()
    assert h.loop.pending == 0 and not h.engine.requests and h.engine.kv.pool.num_in_use == 0
    again = httpx.post(url + "/v1/completions", json={"prompt": "after", "max_tokens": 3, "ignore_eos": True})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 3


def test_a_streamed_request_gets_an_error_event(served, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    h, url = served
    poison(h, monkeypatch, "probe", victim=2)  # ids: 0, 1 normal, 2 the victim (streamed), 3-5 normal
    others, odd = asyncio.run(batch(url, stream_victim=True))
    assert [r.json()["usage"]["completion_tokens"] for r in others] == [24] * 5
    assert isinstance(odd, str)
    payloads = [line[len("data: "):] for line in odd.split("\n") if line]
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    assert [e["choices"][0]["text"] for e in events[:-1]] != []  # it streamed tokens before it failed
    assert events[-1] == {"error": {"message": "the engine failed this request: RuntimeError: injected probe fault",
                                    "type": "server_error", "param": None, "code": None}}
    assert h.counters.snapshot()["failed"] == {"request": 1, "step": 0}
