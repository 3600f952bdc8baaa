"""The server's own probe records: SERVED (at arrival) and REQUEST_TEXT (strings, in chunks).

NETWORK goes through ProbeObserver.on_network. All three are written from the engine thread only:
the ring has a single producer, and that thread also runs the engine's observer callbacks.
"""
from __future__ import annotations

from dataclasses import dataclass

from infersight.probes.observer import ProbeObserver
from infersight.probes.records import (
    TEXT_CHUNK_BYTES, Operation, RecordKind, ServedFlag, TextField, record_struct,
)
from infersight.runtime.engine.sampling import SamplingParams
from infersight.serve.tracecontext import IncomingTrace

_OPERATIONS = {"chat": Operation.CHAT, "text_completion": Operation.TEXT_COMPLETION}


@dataclass(frozen=True)
class ServedRecord:
    """What the sidecar needs to build the request's span that only the server knows."""

    operation: str
    receive_ns: int
    trace: IncomingTrace
    params: SamplingParams
    stream: bool

    @property
    def flags(self) -> int:
        flags = ServedFlag(0)
        if self.stream:
            flags |= ServedFlag.STREAM
        if self.trace.parent_span_id:
            flags |= ServedFlag.REMOTE_PARENT
            if self.trace.sampled:
                flags |= ServedFlag.PARENT_SAMPLED
        if self.trace.invalid:
            flags |= ServedFlag.TRACEPARENT_INVALID
        return int(flags)


class ProbeWriter:
    """Packs and writes the server's records to the probe's ring (never blocks; a full ring drops)."""

    def __init__(self, probe: ProbeObserver, max_text_bytes: int) -> None:
        self.probe = probe
        self.max_text_bytes = max_text_bytes
        self._served = record_struct(RecordKind.SERVED).pack
        self._text = record_struct(RecordKind.REQUEST_TEXT).pack

    def served(self, request_id: int, rec: ServedRecord) -> None:
        p = rec.params
        self.probe.ring.write(RecordKind.SERVED, self._served(
            request_id, rec.receive_ns, rec.trace.parent_span_id, p.temperature, p.top_p, p.top_k,
            p.seed if p.seed is not None else -1, p.max_tokens, _OPERATIONS[rec.operation], rec.flags))

    def text(self, request_id: int, field: TextField, text: str) -> None:
        """The UTF-8 bytes of text, at most max_text_bytes of them, in TEXT_CHUNK_BYTES chunks."""
        # The door refuses lone surrogates; "replace" keeps a text that got past it from raising here.
        data = text.encode("utf-8", errors="replace")[: self.max_text_bytes]
        total = len(data)
        for off in range(0, total, TEXT_CHUNK_BYTES):
            chunk = data[off:off + TEXT_CHUNK_BYTES]
            self.probe.ring.write(RecordKind.REQUEST_TEXT, self._text(request_id, off, total, field, len(chunk), chunk))

    def network(self, request_id: int, receive_ns: int, first_byte_ns: int, last_byte_ns: int) -> None:
        self.probe.on_network(request_id, receive_ns, first_byte_ns, last_byte_ns)
