"""runtime.engine.step_rows on hand-built rows: the forward's name by batch content, and what each
row feeds the target (a prefill chunk, a decode's last token, a verify's token plus its drafts)."""
from __future__ import annotations

import torch

from infersight.runtime.engine.request import Request
from infersight.runtime.engine.sampling import SamplingParams
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.engine.step_rows import forward_name, target_items


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
