"""The messages between `serve`'s front end and its engine process (ZeroMQ PUSH/PULL, msgpack by msgspec).

    front end --(Submit / Abort / Network / Stop)--> engine process
    engine process --(Ready / StartFailed / Batch)--> front end

A Batch is everything one call of the engine thread delivered (a step's new tokens of every request, the
requests it finished), in the order it delivered them, plus the engine side's counters when they moved.
Requests are named by the front end's key (the engine's request id does not exist until Accepted).
Tokens cross as ids; the front end turns them into text, off the engine's interpreter.
"""
from __future__ import annotations

from typing import Union

import msgspec

from infersight.probes.records import TextField
from infersight.runtime.engine.outputs import RequestOutput
from infersight.runtime.engine.sampling import SamplingParams
from infersight.serve.engine_loop import Submission
from infersight.serve.probe_records import ServedRecord
from infersight.serve.tracecontext import IncomingTrace


class Submit(msgspec.Struct, tag=True, array_like=True):
    """A Submission's fields. The trace id crosses as 16 bytes: msgpack integers stop at 64 bits."""

    key: int
    prompt: Union[str, list[int]]
    operation: str
    receive_ns: int
    trace_id: bytes
    parent_span_id: int
    sampled: bool
    tracestate: str
    traceparent_invalid: bool
    params: SamplingParams
    stream: bool
    task: Union[str, None]
    texts: dict[int, str]  # TextField -> text
    export_completion: bool

    @classmethod
    def of(cls, key: int, sub: Submission) -> "Submit":
        rec, trace = sub.record, sub.record.trace
        return cls(key, sub.prompt, rec.operation, rec.receive_ns, trace.trace_id.to_bytes(16, "big"),
                   trace.parent_span_id, trace.sampled, trace.tracestate, trace.invalid, rec.params, rec.stream,
                   sub.task, {int(k): v for k, v in sub.texts.items()}, sub.export_completion)

    def submission(self) -> Submission:
        """The engine process's copy (its loop and event queue unused: Batch messages carry the events)."""
        trace = IncomingTrace(int.from_bytes(self.trace_id, "big"), self.parent_span_id, self.sampled,
                              self.tracestate, self.traceparent_invalid)
        return Submission(self.prompt, ServedRecord(self.operation, self.receive_ns, trace, self.params, self.stream),
                          self.task, None, {TextField(k): v for k, v in self.texts.items()},  # type: ignore[arg-type]
                          export_completion=self.export_completion)


class Abort(msgspec.Struct, tag=True, array_like=True):
    key: int


class Network(msgspec.Struct, tag=True, array_like=True):
    key: int
    receive_ns: int
    first_byte_ns: int
    last_byte_ns: int


class Stop(msgspec.Struct, tag=True, array_like=True):
    pass


Command = Union[Submit, Abort, Network, Stop]


class Ready(msgspec.Struct, tag=True, array_like=True):
    ring_name: str
    max_model_len: int
    graphs_captured: int


class StartFailed(msgspec.Struct, tag=True, array_like=True):
    """The engine could not be built. error: the exception pickled (b"" when it would not pickle), so the
    front end raises the same type (a bad --model is a usage error, exit 2); message: its text."""

    error: bytes
    message: str


class AcceptedOut(msgspec.Struct, tag=True, array_like=True):
    key: int
    request_id: int
    num_prompt_tokens: int


class TokensOut(msgspec.Struct, tag=True, array_like=True):
    key: int
    token_ids: list[int]


class DoneOut(msgspec.Struct, tag=True, array_like=True):
    """output.trace_id crosses as 0 (a 128-bit id; the front end knows it: it made the trace)."""

    key: int
    output: RequestOutput


class FailedOut(msgspec.Struct, tag=True, array_like=True):
    key: int
    status: int
    param: Union[str, None]
    message: str


RequestEvent = Union[AcceptedOut, TokensOut, DoneOut, FailedOut]


class EngineCounts(msgspec.Struct, array_like=True):
    """The engine side's running totals (serve.metrics.ServerCounters' engine-thread counts)."""

    failed: dict[str, int]
    probe_writes_failed: int
    draft_fallbacks: dict[str, int]


class Batch(msgspec.Struct, tag=True, array_like=True):
    events: list[RequestEvent]
    counts: Union[EngineCounts, None] = None


FromEngine = Union[Ready, StartFailed, Batch]

command_encoder = msgspec.msgpack.Encoder()
command_decoder = msgspec.msgpack.Decoder(Command)
engine_encoder = msgspec.msgpack.Encoder()
engine_decoder = msgspec.msgpack.Decoder(FromEngine)
