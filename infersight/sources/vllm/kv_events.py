"""The agent's subscriber for vLLM's KV cache events: ZeroMQ in, the `kv_events` frame out.

    vLLM EngineCore  --PUB-->  SUB (this)  --decode-->  BatchSequencer  --in order-->  KVBlockLedger
                     <-ROUTER- DEALER (replay of what a gap lost)                          |
                                                                       kv_events rows <----+

Which side binds follows vLLM's publisher: it binds only wildcard endpoints (`tcp://*:P`, `[::]`)
and connects to any other. So for the usual loopback endpoint (`tcp://127.0.0.1:P`, given to both
vLLM and the agent) the agent binds it, and for a wildcard one the agent connects to the same port
on this host. vLLM always binds its replay ROUTER; the agent connects to it.

`poll()` never blocks: it reads at most `max_messages_per_poll` messages from each socket without
waiting, and a replay is given up after `replay_timeout_s` without an answer (its holes counted as
lost). Everything dropped is counted by reason and logged in one line, at most one per reason every
LOG_INTERVAL_S. Timestamps: vLLM's `ts` is wall-clock seconds; rows carry the monotonic ns of the
agent's wall anchor (the engine ring's when one is attached), the clock every other frame uses.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
import zmq

from infersight.sources.vllm.kv_blocks import DEFAULT_MAX_COPIES, DEFAULT_REMEMBER_BYTES, KVBlockLedger, KVRows
from infersight.sources.vllm.kv_sequence import BatchSequencer, Restart
from infersight.sources.vllm.kv_wire import (
    EVENT_TYPES, MALFORMED_REASONS, KVBatch, Malformed, check_frames, decode_message, decode_payload, is_replay_end,
)

log = logging.getLogger("infersight.agent")
LOG_INTERVAL_S = 10.0
_TCP = re.compile(r"^tcp://(\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


def _tcp(endpoint: str, what: str) -> tuple[str, int]:
    m = _TCP.match(endpoint)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{what} must be tcp://HOST:PORT, got {endpoint!r}")
    return m.group(1), int(m.group(2))


def _local(host: str, port: int) -> str:
    """Where a wildcard-bound vLLM socket is reached from this host."""
    return f"tcp://{'[::1]' if ':' in host else '127.0.0.1'}:{port}"


def subscriber_plan(endpoint: str) -> tuple[str, str]:
    """("bind" | "connect", address) for the SUB socket, mirroring vLLM's publisher rule."""
    host, port = _tcp(endpoint, "--vllm-kv-events")
    if "*" in endpoint or "::" in endpoint:  # vLLM's ZmqEventPublisher._is_bind_endpoint
        return "connect", _local(host, port) if host in ("*", "[::]") else endpoint
    return "bind", endpoint


def replay_address(endpoint: str) -> str:
    host, port = _tcp(endpoint, "--vllm-kv-replay")
    return _local(host, port) if host in ("*", "[::]") else endpoint


@dataclass(frozen=True)
class VllmKVEventsConfig:
    """endpoint / replay_endpoint: as given to vLLM's --kv-events-config (endpoint, replay_endpoint);
    topic: its `topic`. Bounds: messages read per socket per poll, the replay wait, batches held
    while a replay is open, payload bytes, the bytes of block ids remembered (every copy of every
    hash) and live copies of one hash (kv_blocks: the ledger's bounds)."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = "kv"
    max_messages_per_poll: int = 1024
    # vLLM's ROUTER answers from a thread of its engine process: on a loaded host (vLLM's CPU build
    # takes every core) that answer has come after 2 s; 5 s, and a replay runs MAX_REPLAY_TIMEOUTS of them.
    replay_timeout_s: float = 5.0
    max_held_batches: int = 20_000
    max_payload_bytes: int = 16 << 20
    receive_hwm: int = 100_000
    remember_bytes: int = DEFAULT_REMEMBER_BYTES
    max_copies_per_hash: int = DEFAULT_MAX_COPIES

    def __post_init__(self) -> None:
        subscriber_plan(self.endpoint)
        if self.replay_endpoint is not None:
            replay_address(self.replay_endpoint)
        for name in ("max_messages_per_poll", "max_held_batches", "max_payload_bytes", "receive_hwm",
                     "max_copies_per_hash"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        KVBlockLedger.check(self.remember_bytes, self.max_copies_per_hash)
        if not 0.01 <= self.replay_timeout_s <= 60:
            raise ValueError(f"replay timeout must be between 0.01 and 60 s, got {self.replay_timeout_s}")


class _DropLog:
    """One line per reason at most every interval_s, saying how many were not logged in between."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def __call__(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) < self.interval_s:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return
        quiet = self._quiet.pop(key, 0)
        self._last[key] = now
        log.warning("vLLM KV events: %s%s", message, f" ({quiet} more since the last such line)" if quiet else "")


class VllmKVSubscriber:
    """Subscribes to one vLLM KV event publisher; `poll()` returns the kv_events rows that became
    ready (an empty frame when none). wall_anchor: returns (wall ns, monotonic ns) taken at one
    instant, the agent's clock anchor."""

    def __init__(self, config: VllmKVEventsConfig, wall_anchor: Callable[[], tuple[int, int]] | None = None) -> None:
        self.config = config
        fixed = (time.time_ns(), time.monotonic_ns())
        self.wall_anchor = wall_anchor or (lambda: fixed)
        self.topic = config.topic.encode("utf-8")
        self.mode, self.address = subscriber_plan(config.endpoint)
        self.seq = BatchSequencer(config.replay_endpoint is not None, config.replay_timeout_s, config.max_held_batches)
        self.ledger = KVBlockLedger(config.remember_bytes, config.max_copies_per_hash)
        self.events = {t: 0 for t in EVENT_TYPES}
        self.malformed = {r: 0 for r in MALFORMED_REASONS}
        self._lock = threading.Lock()  # poll() writes the counts, the HTTP thread reads them
        self._log = _DropLog()
        self._lost_logged = 0
        self._ctx = zmq.Context()  # our own context: the process-wide instance is shared state
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, config.receive_hwm)
        # A hard backstop above our own size check: libzmq drops a peer that sends a bigger frame
        # (vLLM's PUB then reconnects) instead of allocating it.
        self._sub.setsockopt(zmq.MAXMSGSIZE, 4 * config.max_payload_bytes)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")  # every topic: a wrong one is counted, not silently filtered
        if "[" in self.address:
            self._sub.setsockopt(zmq.IPV6, 1)
        try:
            if self.mode == "bind":
                self._sub.bind(self.address)
            else:
                self._sub.connect(self.address)
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            hint = " (vLLM connects to a non-wildcard endpoint, so the agent binds it: it must be free and " \
                   "an address of this host)" if self.mode == "bind" else ""
            raise ValueError(f"cannot {self.mode} {self.address} for vLLM's KV events: {exc}{hint}") from None
        self._replay: zmq.Socket | None = None
        self._replay_address = replay_address(config.replay_endpoint) if config.replay_endpoint else None
        self._sessions_seen = 0
        if self._replay_address is not None:
            self._open_replay()
        log.info("vLLM KV events: %s %s (topic %r)%s", "bound" if self.mode == "bind" else "connected to",
                 self.address, config.topic, f", replay from {self._replay_address}" if self._replay_address else "")

    # -- the poll ------------------------------------------------------------------------------
    def poll(self, deliver: Callable[[pd.DataFrame], None] | None = None) -> pd.DataFrame:
        """Read what is waiting, without blocking; the kv_events rows now in sequence order. `deliver`
        gets those rows before the counts are released, so a reader of `stats()` (a scrape) never sees
        a batch counted whose rows are not folded yet."""
        now = time.monotonic()
        with self._lock:
            for _ in range(self.config.max_messages_per_poll):
                try:
                    parts = self._sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_live(parts, now)
            self._sync_replay()
            if self._replay is not None:
                self._read_replay(now)
            self.seq.tick(now)
            self._sync_replay()
            frame = self._apply().frame()
            self._log_losses()
            if deliver is not None:
                deliver(frame)
        return frame

    def _on_live(self, parts: list[bytes], now: float) -> None:
        try:
            batch = decode_message(parts, self.topic, self.config.max_payload_bytes)
        except Malformed as exc:
            batch = self._dropped(exc)
            if batch is None:
                return
        self.seq.live(batch, now)

    def _read_replay(self, now: float) -> None:
        sessions = self.seq.sessions_ended
        for _ in range(self.config.max_messages_per_poll):
            if self._replay is None or self.seq.sessions_ended != sessions:
                return  # the replay ended: what is still queued belongs to it, not to the next one
            try:
                parts = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not parts or parts[0] != b"":
                self._dropped(Malformed("frame_count", f"replay reply of {len(parts)} frames without a delimiter"))
                continue
            body = parts[1:]
            if is_replay_end(body):
                self.seq.replay_end(now)
                continue
            try:
                seq = check_frames(body, self.topic, self.config.max_payload_bytes)
                if not self.seq.wants(seq):  # not a hole: skip the decode
                    self.seq.ignored(seq)
                    continue
                batch: KVBatch | None = decode_payload(seq, body[2])
            except Malformed as exc:
                batch = self._dropped(exc)
            if batch is not None:
                self.seq.replayed(batch, now)

    def _dropped(self, exc: Malformed) -> KVBatch | None:
        """Count a dropped message. One whose sequence number was readable becomes an empty batch in
        its place, so the stream stays in order and the drop is not counted again as a gap."""
        self.malformed[exc.reason] += 1
        self._log(exc.reason, f"dropped a message: {exc}")
        return KVBatch(exc.seq, 0.0, 0, []) if exc.seq is not None else None

    def _sync_replay(self) -> None:
        """Reopen the replay socket after a replay ended, then send the request the sequencer wants."""
        if self._replay_address is None:
            return
        if self.seq.sessions_ended != self._sessions_seen:
            self._sessions_seen = self.seq.sessions_ended
            self._open_replay()
        start = self.seq.take_request()
        if start is not None and self._replay is not None:
            try:
                self._replay.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
            except zmq.Again:  # nothing connected and the queue full: the deadline counts it as lost
                pass

    def _open_replay(self) -> None:
        if self._replay is not None:
            self._replay.close(linger=0)
        self._replay = self._ctx.socket(zmq.DEALER)
        self._replay.setsockopt(zmq.LINGER, 0)
        if self._replay_address and "[" in self._replay_address:
            self._replay.setsockopt(zmq.IPV6, 1)
        self._replay.connect(self._replay_address)

    def _apply(self) -> KVRows:
        rows = KVRows()
        wall, mono = self.wall_anchor()
        for item in self.seq.out:
            ts_ns = int(item.ts * 1e9) - wall + mono
            if isinstance(item, Restart):
                self._log("restart", f"the publisher restarted (restart {self.seq.stats.restarts}): "
                                     "its cached blocks count as evicted")
                self.ledger.clear(ts_ns, rows)
                self.ledger.forget()
                continue
            for reason, n in item.dropped.items():
                self.malformed[reason] += n
                self._log(reason, f"dropped {n} event(s) of batch {item.seq}: {reason}: {item.errors[reason]}")
            for ev in item.events:
                self.events[type(ev).__name__] += 1
            self.ledger.apply(item, ts_ns, rows)
        self.seq.out.clear()
        return rows

    def _log_losses(self) -> None:
        lost = sum(self.seq.stats.lost.values())
        if lost != self._lost_logged:
            self._log("lost", f"{lost - self._lost_logged} batch(es) could not be recovered "
                              f"(lost so far by reason: {self._nonzero(self.seq.stats.lost)})")
            self._lost_logged = lost

    @staticmethod
    def _nonzero(counts: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in counts.items() if v}

    # -- what the agent reads ------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """A snapshot of the counts (batches = sequence numbers; events by vLLM type)."""
        with self._lock:
            s = self.seq.stats
            return {"endpoint": self.config.endpoint, "mode": self.mode, "address": self.address,
                    "replay_endpoint": self.config.replay_endpoint, "topic": self.config.topic,
                    "batches": s.applied, "events": dict(self.events), "gaps": s.gaps, "replayed": s.replayed,
                    "replay_requests": s.replay_requests, "lost": dict(s.lost), "malformed": dict(self.malformed),
                    "restarts": s.restarts, "cached_blocks": self.ledger.cached_blocks,
                    "skipped_other_medium": self.ledger.skipped_other_medium,
                    "ledger_dropped": dict(self.ledger.dropped)}

    def close(self) -> None:
        with self._lock:
            if not self._ctx.closed:
                self._ctx.destroy(linger=0)
