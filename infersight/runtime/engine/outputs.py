"""What a finished request gives back to the caller."""
from __future__ import annotations

from dataclasses import dataclass

from infersight.runtime.engine.request import Request, RequestTimes


@dataclass
class RequestOutput:
    request_id: int
    trace_id: int
    task: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_cached_tokens: int
    num_preemptions: int
    num_spec_proposed: int
    num_spec_accepted: int
    times: RequestTimes

    @classmethod
    def from_request(cls, req: Request, text: str) -> "RequestOutput":
        return cls(req.request_id, req.trace_id, req.task, list(req.prompt_token_ids), list(req.output_token_ids), text,
                   req.finish_reason, req.num_prefix_hit_tokens, req.num_preemptions,
                   req.num_spec_proposed, req.num_spec_accepted, req.times)
