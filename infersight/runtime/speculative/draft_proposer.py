"""The draft model's turn in a speculative step: catch its KV up, then propose tokens."""
from __future__ import annotations

import torch

from infersight.runtime.runner.model_runner import FeedItem, ModelRunner
from infersight.runtime.engine.request import Request
from infersight.runtime.engine.sampling import probs_from_logits, sample
from infersight.runtime.engine.scheduler import ScheduledRequest
from infersight.runtime.speculative.verify import DraftFallbacks


def propose(draft: ModelRunner, sched: list[ScheduledRequest], fallbacks: DraftFallbacks, requests: dict[int, Request]
            ) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
    """Run the draft: catch its KV up with the target for every request, then propose
    num_spec_tokens tokens, one batched draft forward per position."""
    drafts: dict[int, list[int]] = {}
    probs: dict[int, list[torch.Tensor]] = {}
    items = []
    for s in sched:
        req = s.req
        end = req.num_computed + s.num_new_tokens
        if end > req.draft_computed:
            items.append(FeedItem(req, req.draft_computed, req.token_ids[req.draft_computed:end],
                                  1 if s.num_spec_tokens else 0))
    spec = [s for s in sched if s.num_spec_tokens]
    logits = dict(zip((it.req.request_id for it in items), draft.run(items)))
    for s in sched:
        if not s.num_spec_tokens:
            s.req.draft_computed = s.req.num_computed + s.num_new_tokens
    for j in range(max((s.num_spec_tokens for s in spec), default=0)):
        if j > 0:
            active = [s for s in spec if s.num_spec_tokens > j and s.req.request_id in drafts]
            if not active:
                break
            feed = [FeedItem(s.req, s.req.num_tokens + j - 1, [drafts[s.req.request_id][-1]], 1) for s in active]
            logits = dict(zip((s.req.request_id for s in active), draft.run(feed)))
        for s in spec:
            rid = s.req.request_id
            if s.num_spec_tokens > j and (j == 0 or rid in drafts):
                try:
                    q = probs_from_logits(logits[rid][-1:], s.req.params)[0]
                    drafts.setdefault(rid, []).append(sample(q, s.req.generator))
                    probs.setdefault(rid, []).append(q)
                except Exception as exc:  # noqa: BLE001 -- this request decodes plainly (DraftFallbacks)
                    drafts.pop(rid, None)
                    probs.pop(rid, None)
                    fallbacks.request_failed(rid, exc, requests)
    return drafts, {rid: torch.stack(p) for rid, p in probs.items()}
