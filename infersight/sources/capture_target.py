"""What an engine captured without a control block must offer the agent (a CaptureTarget), and
what the two say to each other: a capture's outcome, and a refusal with its HTTP status.

Below both: the agent's capture controller (agent.capture) drives a target; a source that is one
(sources.vllm.profiler, vLLM's profiler endpoints) implements it, without importing the agent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class CaptureRefused(Exception):
    """status: the HTTP status to answer with (409 busy, 429 too soon, 503 no engine)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class CaptureOutcome:
    """How a target's capture ended: state done | failed, the trace, and its analysis (or, when it
    failed, {"error": why})."""

    state: str
    path: str = ""
    analysis: dict[str, Any] | None = None


class CaptureTarget(Protocol):
    """An engine captured without a control block. name: what its records show as `ring`; tools: the
    capture tools it offers. start() must return at once (the capture runs in the background);
    poll() gives the outcome once, when the capture has ended."""

    name: str
    tools: tuple[str, ...]

    def start(self, capture_id: int, steps: int) -> None: ...

    def poll(self) -> CaptureOutcome | None: ...

    def close(self) -> None: ...
