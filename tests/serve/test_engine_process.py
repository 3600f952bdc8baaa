"""serve.engine_client + serve.engine_process: the engine in a process of its own behind the same HTTP app.

The reference for every answer is the engine itself, run directly in this process on the same prompt
(greedy, so the tokens are the model's own). The ring is read back as the agent reads it; the engine
process is killed for real; a front end is killed for real and its orphaned engine must go.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from serve_fixtures import TINY, unique_ring
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig
from infersight.runtime.engine.sampling import SamplingParams
from infersight.serve.app import build_app
from infersight.serve.config import ServeConfig
from infersight.serve.engine_client import EngineClient

ENGINE = EngineConfig(model=TINY, num_kv_blocks=32, block_size=8)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # a 128-bit id: more than msgpack's integers hold


def direct(prompt: str, max_tokens: int) -> tuple[str, int]:
    """The engine's own greedy answer, in this process."""
    engine = Engine(ENGINE)
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    out = engine.release(rid)
    return out.text, len(out.token_ids)


@pytest.fixture(scope="module")
def client():  # type: ignore[no-untyped-def]
    c = EngineClient(ENGINE, ProbeConfig(ring_name=unique_ring("split"), nvtx=False), max_text_bytes=1024,
                     max_pending=8)
    c.start()
    yield c
    c.stop()


def http(c: EngineClient) -> httpx.AsyncClient:
    app = build_app(c, ServeConfig(model_name="tiny-test"))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve.test", timeout=60)


async def post(c: EngineClient, payload: dict[str, object], headers: dict[str, str] | None = None) -> httpx.Response:
    async with http(c) as h:
        return await h.post("/v1/completions", json=payload, headers=headers or {})


def body(prompt: str, n: int, stream: bool = False) -> dict[str, object]:
    return {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": stream}


def test_answers_are_the_engine_s_own_streamed_or_not(client: EngineClient) -> None:
    want_text, want_tokens = direct("the quick brown fox", 12)

    async def ask() -> tuple[httpx.Response, list[dict]]:
        async with http(client) as c:
            r = await c.post("/v1/completions", json=body("the quick brown fox", 12),
                             headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
            chunks = []
            async with c.stream("POST", "/v1/completions", json=body("the quick brown fox", 12, stream=True)) as s:
                async for line in s.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
        return r, chunks

    r, chunks = asyncio.run(ask())
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == want_text
    assert r.json()["usage"]["completion_tokens"] == want_tokens == 12
    assert r.headers["x-infersight-trace-id"] == TRACE
    assert "".join(ch["choices"][0]["text"] or "" for ch in chunks) == want_text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert client.pending == 0


def test_the_ring_holds_the_served_request_under_its_128_bit_trace(client: EngineClient) -> None:
    consumer = RingConsumer.attach(client.ring_name, record_registry())
    consumer.read()  # what earlier tests wrote
    r = asyncio.run(post(client, body("abc", 3), {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}))
    rid = int(r.headers["x-infersight-request-id"])
    deadline = time.monotonic() + 10
    events, network, served, labels = [], [], [], {0: "other"}
    while time.monotonic() < deadline and not network:  # the NETWORK record follows the last byte
        records = consumer.read()
        labels = update_labels(labels, records)
        frames = EventFrames.from_records(records, labels)
        events.extend(frames.request_events.query("request_id == @rid").to_dict("records"))
        network.extend(frames.network.query("request_id == @rid").to_dict("records"))
        served.extend(frames.served.query("request_id == @rid").to_dict("records"))
        time.sleep(0.05)
    consumer.close()
    assert {"ARRIVED", "FINISHED"} <= {e["event"] for e in events}
    assert len(network) == 1 and len(served) == 1
    assert network[0]["first_byte_ns"] <= network[0]["last_byte_ns"]
    assert {e["trace_id"] for e in events} == {TRACE}


def test_an_engine_refusal_is_a_400_and_releases_its_slot(client: EngineClient) -> None:
    r = asyncio.run(post(client, {"prompt": [10 ** 6], "max_tokens": 2}))  # no such token id
    assert r.status_code == 400, r.text
    assert client.pending == 0


class FirstDecoderFails:
    """The model's tokenizer, except that the first request's stream decoder raises at its first tokens."""

    def __init__(self, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer, self.made = tokenizer, 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.tokenizer, name)

    def stream_decoder(self):  # type: ignore[no-untyped-def]
        self.made += 1
        decoder = self.tokenizer.stream_decoder()
        if self.made == 1:
            def broken(ids):  # type: ignore[no-untyped-def]
                raise UnicodeError("broken on purpose")
            decoder.step = broken
        return decoder


def test_a_request_the_front_end_cannot_decode_fails_alone() -> None:
    from infersight.runtime.checkpoints.hf_tokenizer import tokenizer_for

    c = EngineClient(ENGINE, ProbeConfig(ring_name=unique_ring("split-decode"), nvtx=False), 1024,
                     tokenizer=FirstDecoderFails(tokenizer_for(ENGINE.model_config)))
    c.start()
    try:
        first = asyncio.run(post(c, body("the quick brown fox", 8)))
        second = asyncio.run(post(c, body("the quick brown fox", 8)))
    finally:
        c.stop()
    assert first.status_code == 500 and "broken on purpose" in first.json()["error"]["message"]
    assert second.status_code == 200
    assert second.json()["choices"][0]["text"] == direct("the quick brown fox", 8)[0]
    assert c.counters.snapshot()["failed"]["request"] == 1
    assert c.pending == 0


def test_a_killed_engine_fails_what_is_in_flight_and_health_says_so() -> None:
    c = EngineClient(ENGINE, ProbeConfig(ring_name=unique_ring("split-kill"), nvtx=False), 1024)
    c.start()
    try:
        async def scenario() -> tuple[list[int], int, int]:
            async with http(c) as h:
                posts = [asyncio.ensure_future(h.post("/v1/completions", json=body("x" * 20, 200)))
                         for _ in range(3)]
                while c.pending < 3:
                    await asyncio.sleep(0.01)
                os.kill(c.pid, signal.SIGKILL)
                codes = [r.status_code for r in await asyncio.gather(*posts)]
                health = (await h.get("/health")).status_code
                after = (await h.post("/v1/completions", json=body("y", 2))).status_code
            return codes, health, after

        codes, health, after = asyncio.run(scenario())
    finally:
        c.stop()
    assert codes == [500, 500, 500]
    assert health == 503 and after == 503
    assert c.counters.snapshot()["failed"]["step"] == 3
    assert c.pending == 0


def test_a_start_up_error_is_raised_as_its_own_type() -> None:
    c = EngineClient(EngineConfig(model=TINY, device="meta"), ProbeConfig(ring_name=unique_ring("split-bad"),
                                                                          nvtx=False), 1024)
    with pytest.raises(Exception) as err:
        c.start()
    direct_error = None
    try:
        Engine(EngineConfig(model=TINY, device="meta"))
    except Exception as exc:  # noqa: BLE001 -- whatever the engine raises in-process is the reference
        direct_error = exc
    assert direct_error is not None
    assert type(err.value) is type(direct_error) and str(err.value) == str(direct_error)
    assert not Path("/dev/shm", c.probe_config.ring_name).exists()


def test_stop_ends_the_engine_process_and_removes_its_ring() -> None:
    ring = unique_ring("split-stop")
    c = EngineClient(ENGINE, ProbeConfig(ring_name=ring, nvtx=False), 1024)
    c.start()
    pid = c.pid
    assert Path("/dev/shm", ring).exists()
    c.stop()
    assert not _alive(pid)
    assert not Path("/dev/shm", ring).exists()


def test_an_orphaned_engine_process_exits(tmp_path: Path) -> None:
    """The front end is SIGKILLed (no Stop): the engine notices its parent is gone and exits."""
    script = tmp_path / "front.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = {[p for p in sys.path if p]!r}
        from infersight.probes.config import ProbeConfig
        from infersight.runtime import EngineConfig
        from infersight.serve.engine_client import EngineClient
        from serve_fixtures import TINY
        if __name__ == "__main__":
            c = EngineClient(EngineConfig(model=TINY, num_kv_blocks=32, block_size=8),
                             ProbeConfig(ring_name="{unique_ring('split-orphan')}", nvtx=False), 1024)
            c.start()
            print(c.pid, flush=True)
            time.sleep(120)
    """))
    front = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             cwd=str(Path(__file__).parent))
    try:
        engine_pid = int(front.stdout.readline())  # type: ignore[union-attr]
        front.kill()
        front.wait(10)
        deadline = time.monotonic() + 10
        while _alive(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(engine_pid)
    finally:
        front.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); its state in /proc says whether it runs
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
