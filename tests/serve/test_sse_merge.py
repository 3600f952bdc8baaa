"""serve.app._sse: deltas already queued when the handler wakes go out as one chunk (one body, one
send), their text and token counts added; the finish chunk and [DONE] follow in the same write."""
from __future__ import annotations

import asyncio
import json

from infersight.runtime.engine.outputs import RequestOutput
from infersight.runtime.engine.request import RequestTimes
from infersight.serve import protocol as P
from infersight.serve.app import _sse
from infersight.serve.engine_loop import Delta, Done, Submission


class NoEngine:
    def abort(self, sub: Submission) -> None:
        raise AssertionError("a finished stream aborts nothing")


def output(tokens: int) -> RequestOutput:
    return RequestOutput(request_id=1, trace_id=0, task=None, prompt_token_ids=[1, 2, 3], token_ids=list(range(tokens)),
                         text="", finish_reason="length", num_cached_tokens=0, num_preemptions=0, num_spec_proposed=0,
                         num_spec_accepted=0, times=RequestTimes(arrival_ns=0))


def test_queued_deltas_are_one_chunk_with_their_tokens() -> None:
    req = P.parse_completion({"prompt": "abc", "max_tokens": 4, "stream": True,
                              "stream_options": {"include_usage": True, "continuous_usage_stats": True}}, "m")

    async def go() -> list[str]:
        sub = Submission(prompt="abc", record=None, task=None, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        for event in (Delta("he", 2), Delta("", 1), Delta("y", 1), Done(output(4))):
            sub.events.put_nowait(event)
        return [piece async for piece in _sse(NoEngine(), sub, req, "cmpl-1", 3)]  # type: ignore[arg-type]

    writes = asyncio.run(go())
    assert len(writes) == 1
    events = [line[len("data: "):] for line in writes[0].split("\n") if line]
    assert events[-1] == "[DONE]"
    text, finish, use = (json.loads(e) for e in events[:-1])
    assert text["choices"][0]["text"] == "hey" and text["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                                                      "total_tokens": 7}
    assert finish["choices"][0]["finish_reason"] == "length" and finish["usage"]["completion_tokens"] == 4
    assert use["choices"] == [] and use["usage"]["completion_tokens"] == 4


def test_one_delta_at_a_time_is_one_chunk_each() -> None:
    req = P.parse_completion({"prompt": "abc", "max_tokens": 2, "stream": True}, "m")

    async def go() -> list[str]:
        sub = Submission(prompt="abc", record=None, task=None, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        gen = _sse(NoEngine(), sub, req, "cmpl-1", 3)  # type: ignore[arg-type]
        out = []
        for event in (Delta("h", 1), Delta("i", 1), Done(output(2))):
            sub.events.put_nowait(event)
            out.append(await gen.__anext__())
        return out

    writes = asyncio.run(go())
    texts = [json.loads(w.split("\n")[0][len("data: "):])["choices"][0]["text"] for w in writes]
    assert texts == ["h", "i", ""] and writes[-1].endswith("data: [DONE]\n\n")
    assert all("usage" not in json.loads(w.split("\n")[0][len("data: "):]) for w in writes)
