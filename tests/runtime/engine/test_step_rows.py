"""runtime.engine.step_rows on hand-built rows: the forward's name by batch content, and what each
row feeds the target (a prefill chunk, a decode's last token, a verify's token plus its drafts)."""
from __future__ import annotations

import torch

from infersight.runtime.engine.request import Request
from infersight.runtime.engine.sampling import SamplingParams
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.engine.step_rows import forward_name, target_items, tell_emitted
from infersight.runtime.observer import EngineObserver


def request(rid: int, prompt: list[int], out: list[int], computed: int) -> Request:
    req = Request(rid, prompt, SamplingParams(max_tokens=8), torch.Generator(), 0)
    req.output_token_ids, req.num_computed = list(out), computed
    return req


def test_forward_names() -> None:
    pre = ScheduledRequest(request(0, [1, 2, 3, 4], [], 0), 2)
    dec = ScheduledRequest(request(1, [1, 2], [5], 2), 1)
    ver = ScheduledRequest(request(2, [1, 2], [5], 2), 1, 3)
    assert forward_name([pre], {0}) == "forward.prefill"
    assert forward_name([dec], set()) == "forward.decode"
    assert forward_name([pre, dec], {0}) == "forward.mixed"
    assert forward_name([dec, ver], set()) == "forward.verify"


def test_target_items_per_row() -> None:
    chunk = ScheduledRequest(request(0, [1, 2, 3, 4, 5], [], 2), 2)      # positions 2..3 of the prompt
    last = ScheduledRequest(request(1, [1, 2, 3], [], 0), 3)             # the whole prompt: samples
    dec = ScheduledRequest(request(2, [1, 2], [7, 8], 3), 1)             # the last output token
    ver = ScheduledRequest(request(3, [1, 2], [9], 2), 1, 2)             # token 9 and two drafts
    items = target_items([chunk, last, dec, ver], {3: [10, 11]})
    assert [(i.req.request_id, i.start_pos, i.tokens, i.logits) for i in items] == [
        (0, 2, [3, 4], 0), (1, 0, [1, 2, 3], 1), (2, 3, [8], 1), (3, 2, [9, 10, 11], 3)]


class _Flaky(EngineObserver):
    """The batched call always raises; the single call raises for request 2."""

    def __init__(self) -> None:
        self.told: list[tuple[int, int]] = []

    def on_tokens_emitted_many(self, request_ids, ts_ns, counts) -> None:  # type: ignore[no-untyped-def]
        raise RuntimeError("batched")

    def on_tokens_emitted(self, request_id: int, ts_ns: int, n: int) -> None:
        if request_id == 2:
            raise RuntimeError("single")
        self.told.append((request_id, n))


def test_tell_emitted_falls_back_to_one_call_each_and_fails_only_the_request_whose_call_raises() -> None:
    observer, failed = _Flaky(), []
    emitted = [(request(1, [1], [5], 1), 1), (request(2, [1], [5], 1), 3), (request(3, [1], [5], 1), 2)]
    tell_emitted(observer, emitted, lambda req, exc: failed.append((req.request_id, str(exc))))
    assert observer.told == [(1, 1), (3, 2)] and failed == [(2, "single")]
