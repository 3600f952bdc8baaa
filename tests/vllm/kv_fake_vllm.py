"""A vLLM 0.32 KV event publisher written here, byte for byte as vLLM defines it
(vllm/distributed/kv_events.py): the msgspec structs below are vLLM's (same fields, defaults and struct
options), the PUB connects to a non-wildcard endpoint, and the ROUTER answers replays exactly as
ZmqEventPublisher._service_replay does. Shared by tests/vllm/test_vllm_kv_events.py; no vLLM needed.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

import msgspec
import pandas as pd
import zmq

from infersight.sources.vllm.kv_events import VllmKVSubscriber


# -- vLLM's event structs (copied field for field; the agent must not import vLLM) -------------------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


#: msgspec.msgpack.encode of a KVEventBatch built with vLLM 0.32's own classes (ts 1700000000.25;
#: BlockStored of [bytes(range(32)), 7] with session_id "abc"; BlockRemoved of bytes(range(32)); a clear).
VLLM_032_PAYLOAD = bytes.fromhex(
    "93cb41d954fc40100000938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c420000102030405"
    "060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f07b1706172656e745f626c6f636b5f68617368c0a9746f6b65"
    "6e5f69647393010203aa626c6f636b5f73697a6520a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65"
    "c0a967726f75705f69647800aa73657373696f6e5f6964a361626384a474797065ac426c6f636b52656d6f766564ac626c6f63"
    "6b5f68617368657391c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fa66d656469756da3"
    "475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400")
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def h(i: int) -> bytes:
    """A 32-byte block hash (vLLM's sha256 default) whose low 64 bits are i."""
    return bytes(24) + i.to_bytes(8, "big")


def stored(*ids: int, session: str | None = None) -> BlockStored:
    return BlockStored(block_hashes=[h(i) for i in ids], parent_block_hash=None, token_ids=[1] * 32 * len(ids),
                       block_size=32, lora_id=None, medium="GPU", lora_name=None, group_idx=0, session_id=session)


def removed(*ids: int) -> BlockRemoved:
    return BlockRemoved(block_hashes=[h(i) for i in ids], medium="GPU", group_idx=0)


class FakeVllm:
    """ZmqEventPublisher's wire behaviour, driven step by step by the test."""

    def __init__(self, endpoint: str, replay: str | None, subscriber: VllmKVSubscriber, topic: bytes = b"kv",
                 buffer_steps: int = 10_000) -> None:
        self.ctx = zmq.Context()
        self.subscriber = subscriber
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay, topic
        self.buffer_steps = buffer_steps
        self.pub = self.router = None
        self.start()

    def start(self) -> None:
        """A fresh publisher process: new sockets, sequence numbers from 0, an empty buffer."""
        self.seq, self.buffer = 0, deque(maxlen=self.buffer_steps)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        monitor = self.pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.pub.connect(self.endpoint)  # vLLM connects to a non-wildcard endpoint
        assert monitor.poll(5000), "the subscriber never accepted the publisher"
        self.pub.disable_monitor()
        monitor.close(linger=0)
        # The PUB drops everything until the SUB's subscription has reached it. The bound SUB sends
        # it when it takes in the new connection, which it does inside the agent's polls (every
        # 0.1 s in the agent); the PUB reads it when it processes commands (ZMQ_EVENTS does that).
        for _ in range(5):
            assert self.subscriber.poll().empty
            time.sleep(0.02)
            self.pub.getsockopt(zmq.EVENTS)
        if self.replay_endpoint:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(self.replay_endpoint)

    def stop(self) -> None:
        for sock in (self.pub, self.router):
            if sock is not None:
                sock.close(linger=0)
        self.pub = self.router = None

    def publish(self, *events: KVCacheEvent, ts: float = 1000.0, send: bool = True) -> int:
        """One batch; send=False keeps it in the replay buffer only (lost in transit)."""
        seq, self.seq = self.seq, self.seq + 1
        payload = msgspec.msgpack.encode(KVEventBatch(ts=ts, events=list(events), data_parallel_rank=0))
        if send:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        return seq

    def send_raw(self, *frames: bytes) -> None:
        self.pub.send_multipart(frames)

    def serve_replay(self) -> int:
        """Answer waiting replay requests as vLLM does; how many were answered."""
        answered = 0
        while self.router is not None and self.router.poll(0):
            frame = self.router.recv_multipart()
            if len(frame) != 3:
                continue
            client_id, _, start_seq_bytes = frame
            start_seq = int.from_bytes(start_seq_bytes, "big")
            for seq, buf in self.buffer:
                if seq >= start_seq:
                    self.router.send_multipart((client_id, b"", self.topic, seq.to_bytes(8, "big"), buf))
            self.router.send_multipart((client_id, b"", b"", END_SEQ, b""))
            answered += 1
        return answered

    def close(self) -> None:
        self.stop()
        self.ctx.destroy(linger=0)


def pump(sub: VllmKVSubscriber, fake: FakeVllm | None, until: Callable[[pd.DataFrame], bool],
         timeout_s: float = 5.0, answer: bool = True) -> pd.DataFrame:
    """Poll as the agent does (answering replays if asked) until `until(all rows so far)`."""
    frames, deadline = [], time.monotonic() + timeout_s
    while True:
        start = time.monotonic()
        frames.append(sub.poll())
        assert time.monotonic() - start < 0.5, "a poll blocked"
        rows = pd.concat(frames, ignore_index=True)
        if until(rows) or time.monotonic() > deadline:
            return rows
        if fake is not None and answer:
            fake.serve_replay()
        time.sleep(0.01)
