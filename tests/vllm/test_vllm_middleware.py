"""InfersightMiddleware as pure ASGI around a small app that reads its body and answers, as vLLM's
handlers do: the request id it sets, the records it writes and when (SERVED before the app has the
body, NETWORK after the last byte), task and trace reaching the writer. No vLLM needed."""
from __future__ import annotations

import asyncio
import json
from typing import Iterator

import pytest
from testkit import unique_ring

from infersight.correlate.frames import EventFrames, join_texts
from infersight.probes.config import ProbeConfig
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.vllm.ids import join_key, key_for_vllm_id
from infersight.vllm.middleware import InfersightMiddleware
from infersight.vllm.writer import VllmProbeSettings, VllmRingWriter

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class BodyReadingApp:
    """Reads the whole body, notes the x-request-id it was given and what the ring held by then,
    then answers in two body chunks (as a streamed response would)."""

    def __init__(self, consumer: RingConsumer) -> None:
        self.consumer = consumer
        self.seen_request_id = ""
        self.frames_at_body = EventFrames()

    async def __call__(self, scope: dict, receive, send) -> None:  # noqa: ANN001
        self.seen_request_id = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        while (await receive()).get("more_body"):
            pass
        self.frames_at_body = EventFrames.from_records(self.consumer.read(), {})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


@pytest.fixture
def ring() -> Iterator[tuple[VllmRingWriter, RingConsumer]]:
    yield from _ring(export_content=False)


def _ring(export_content: bool) -> Iterator[tuple[VllmRingWriter, RingConsumer]]:
    writer = VllmRingWriter(VllmProbeSettings(ProbeConfig(ring_name=unique_ring("vllm-mw"), ring_capacity=512),
                                              export_content=export_content))
    writer.open()
    consumer = RingConsumer.attach(writer.ring_name, record_registry())
    yield writer, consumer
    consumer.close()
    writer.close()


def call(app: object, path: str, body: dict, headers: dict[str, str], method: str = "POST") -> list[dict]:
    raw = json.dumps(body).encode()
    chunks = [raw[:5], raw[5:]]  # the body in two receive() messages
    sent: list[dict] = []

    async def receive() -> dict:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(app(scope, receive, send))
    return sent


def test_completion_without_request_id(ring: tuple[VllmRingWriter, RingConsumer]) -> None:
    writer, consumer = ring
    inner = BodyReadingApp(consumer)
    app = InfersightMiddleware(inner, writer)
    sent = call(app, "/v1/completions", {"prompt": "hi", "max_tokens": 5, "temperature": 0, "stream": True,
                                         "user": "u1"},
                {"x-infersight-task": "code", "traceparent": TRACEPARENT, "tracestate": "k=v"})
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body", "http.response.body"]
    base = inner.seen_request_id
    assert len(base) == 32 and int(base, 16) >= 0  # hex, no dashes
    key = join_key(base, 0)
    assert key == key_for_vllm_id(f"cmpl-{base}-0")  # what the stat logger computes from vLLM's id
    # Before the app had the whole body (so before any engine could see it): SERVED and the texts.
    at_body = inner.frames_at_body
    served = at_body.served.iloc[0]
    assert at_body.served["request_id"].tolist() == [key] and at_body.network.empty
    assert (served["operation"], served["stream"], served["remote_parent"], served["parent_sampled"]) == (
        "text_completion", True, True, True)
    assert (served["temperature"], served["max_tokens"], served["top_k"], served["seed"]) == (0.0, 5, -1, -1)
    assert served["parent_span_id"] == 0xB7AD6B7169203331
    assert join_texts(at_body.texts) == {(key, "user_id"): "u1", (key, "tracestate"): "k=v"}  # no prompt
    # After the last byte: NETWORK, ordered receive <= first byte <= last byte.
    after = EventFrames.from_records(consumer.read(), {})
    net = after.network.iloc[0]
    assert after.network["request_id"].tolist() == [key]
    assert net["receive_ns"] <= net["first_byte_ns"] < net["last_byte_ns"]
    # The stat logger will find the caller's trace and task for this key.
    ctx = writer.take_context(key)
    assert (ctx.trace_hi << 64 | ctx.trace_lo) == 0x0AF7651916CD43DD8448EB211C80319C
    assert writer.tasks.ids["code"] == ctx.task_id == 1 and writer.failures == {}


def test_caller_request_id_and_prompt_list(ring: tuple[VllmRingWriter, RingConsumer]) -> None:
    writer, consumer = ring
    inner = BodyReadingApp(consumer)
    call(InfersightMiddleware(inner, writer), "/v1/completions", {"prompt": ["a", "b", "c"]},
         {"X-Request-Id": "my-id-7"})
    assert inner.seen_request_id == "my-id-7"  # the caller's, untouched
    keys = [join_key("my-id-7", i) for i in range(3)]
    assert keys == [key_for_vllm_id(f"cmpl-my-id-7-{i}") for i in range(3)]
    frames = inner.frames_at_body.concat(EventFrames.from_records(consumer.read(), {}))
    assert frames.served["request_id"].tolist() == keys and frames.network["request_id"].tolist() == keys
    # No traceparent: a new trace; completions default max_tokens 16; unset sampling is unknown (NaN).
    served = frames.served.iloc[0]
    assert served["max_tokens"] == 16 and served["temperature"] != served["temperature"]
    assert not served["remote_parent"] and writer.take_context(keys[2]).task_id == 0


def test_chat_with_content_export_and_other_routes() -> None:
    for writer, consumer in _ring(export_content=True):
        inner = BodyReadingApp(consumer)
        app = InfersightMiddleware(inner, writer)
        messages = [{"role": "user", "content": "hello"}]
        call(app, "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 9},
             {"x-request-id": "c1", "x-infersight-session-id": "s9"})
        key = key_for_vllm_id("chatcmpl-c1")
        frames = inner.frames_at_body.concat(EventFrames.from_records(consumer.read(), {}))
        assert frames.served["operation"].tolist() == ["chat"] and frames.served["max_tokens"].tolist() == [9]
        assert join_texts(frames.texts) == {(key, "session_id"): "s9", (key, "prompt"): json.dumps(messages)}
        # Anything but a generation POST passes through unobserved.
        call(app, "/v1/models", {}, {}, method="GET")
        call(app, "/v1/completions", {}, {}, method="GET")
        assert consumer.read() == {}


def test_a_body_that_is_not_json_still_passes(ring: tuple[VllmRingWriter, RingConsumer]) -> None:
    writer, consumer = ring
    inner = BodyReadingApp(consumer)
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{not json", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"x-request-id", b"z")]}
    asyncio.run(InfersightMiddleware(inner, writer)(scope, receive, send))
    assert sent[0]["status"] == 200 and writer.failures == {}
    assert inner.frames_at_body.served["request_id"].tolist() == [join_key("z", 0)]
