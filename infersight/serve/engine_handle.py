"""What the HTTP app needs of the engine, whichever way it runs: serve.engine_loop.EngineLoop (a thread of
this process) or serve.engine_client.EngineClient (a process of its own). Every method is called from the
event loop; events come back on each Submission's own queue (Accepted, Delta..., then Done or Failed)."""
from __future__ import annotations

from typing import Any, Protocol

from infersight.serve.engine_loop import Submission
from infersight.serve.metrics import ServerCounters


class EngineHandle(Protocol):
    max_pending: int
    max_model_len: int
    counters: ServerCounters

    @property
    def alive(self) -> bool: ...

    @property
    def pending(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    def try_reserve(self) -> bool:
        """One more request in flight, or False (the handler answers 429); released when it ends."""

    def submit(self, sub: Submission) -> None: ...

    def abort(self, sub: Submission) -> None:
        """Stop a request whose client went away (a no-op once it finished)."""

    def network_done(self, sub: Submission, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        """The response's timing, after its last byte (the NETWORK record)."""
