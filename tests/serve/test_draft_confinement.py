"""`infersight serve` with a draft model: a request the draft fails for (NaN draft logits, injected for
that request only) is answered 200 with all its tokens like the others beside it, nothing is
counted as failed, and the fallback is counted on /metrics
(infersight_server_draft_fallbacks_total{scope="request"} 1). Before, the whole step raised and
every request in flight got a 500."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import torch
from serve_fixtures import MODEL, Harness

from infersight.serve.config import ServeConfig

BODY = {"prompt": "hello there", "max_tokens": 12, "ignore_eos": True, "temperature": 1.0}


def test_draft_failure_of_one_request_is_confined_and_counted() -> None:
    with Harness(ServeConfig(model_name=MODEL), speculative=True) as h:
        victim = 1  # the second request submitted
        real_run = h.engine.draft.run

        def nan_for_victim(items: list[Any], *args: Any) -> list[torch.Tensor]:
            out = real_run(items, *args)
            return [torch.full_like(o, float("nan")) if it.req.request_id == victim else o
                    for it, o in zip(items, out)]

        h.engine.draft.run = nan_for_victim

        async def go() -> tuple[list[httpx.Response], str]:
            async with h.client() as c:
                first = asyncio.ensure_future(c.post("/v1/completions", json={**BODY, "seed": 1}))
                await asyncio.sleep(0.05)
                rest = [asyncio.ensure_future(c.post("/v1/completions", json={**BODY, "seed": s})) for s in (2, 3)]
                responses = [await first] + [await r for r in rest]
                return responses, (await c.get("/metrics")).text

        responses, metrics = asyncio.run(go())
        assert [r.status_code for r in responses] == [200, 200, 200]
        assert [r.json()["usage"]["completion_tokens"] for r in responses] == [12, 12, 12]
        assert sorted(r.headers["x-infersight-request-id"] for r in responses) == ["0", "1", "2"]
        assert 'infersight_server_draft_fallbacks_total{scope="request"} 1.0' in metrics
        assert 'infersight_server_draft_fallbacks_total{scope="step"} 0.0' in metrics
        assert 'infersight_server_requests_failed_total{scope="request"} 0.0' in metrics
        assert 'infersight_server_requests_failed_total{scope="step"} 0.0' in metrics
        assert h.engine.draft_fallbacks.off == {victim}
