"""A real vLLM (tiny Llama, CPU, a 64-block KV cache, prefix caching) publishing KV events, the real
agent beside it as a subprocess, and the test in between:

    vLLM PUB --connect--> test SUB (binds vLLM's endpoint) --relay--> agent SUB (binds its own)
    vLLM ROUTER (replay) <--------------------------- agent DEALER, and the test's DEALER at the end

The test counts every raw frame with its own untyped msgpack decode, and forwards it unchanged,
except that it withholds every fifth batch during the workload: the agent must get those from
vLLM's real replay endpoint. Why a relay rather than enumerating through the replay endpoint
afterwards: the relay is the only way to count the frames vLLM sent *and* make real gaps the agent
has to recover from. At the end the test asks vLLM's replay buffer for everything from sequence 0
itself, to show that what it counted is all vLLM published (nothing lost before the relay).

The workload: shared-prefix token-id prompts whose distinct blocks outnumber the cache, so blocks
are evicted, then the first group again, so evicted content is computed again. One server start.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import msgspec
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families
from testkit import free_port

from infersight.sources.vllm.kv_sequence import MAX_REPLAY_TIMEOUTS
from infersight.vllm.launch import REPO_ROOT, VllmServer, VllmServerConfig

MODEL = "tiny-llama"
BLOCK = 32
GROUPS, PER_GROUP = 4, 6
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# A replay answer waits for vLLM's engine process; on a loaded CI host that has taken over 2 s.
REPLAY_TIMEOUT_S = 10.0


def prompts() -> list[list[int]]:
    """GROUPS shared 3-block prefixes, each behind PER_GROUP distinct 3-block suffixes (token ids)."""
    rng = random.Random(14)
    prefixes = [[rng.randrange(10, 500) for _ in range(3 * BLOCK)] for _ in range(GROUPS)]
    return [p + [rng.randrange(10, 500) for _ in range(3 * BLOCK)] for p in prefixes for _ in range(PER_GROUP)]


def complete(base: str, prompt: list[int]) -> int:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 (our own server)
        return resp.status


class Relay(threading.Thread):
    """Receives vLLM's frames, counts them, forwards them unchanged (or withholds them)."""

    def __init__(self, ctx: zmq.Context, bind: str, forward_to: str) -> None:
        super().__init__(daemon=True, name="kv-relay")
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.bind(bind)  # vLLM connects to a non-wildcard endpoint
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.connect(forward_to)
        self.withhold = False
        self.frames: list[list[bytes]] = []
        self.withheld: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.pub.getsockopt(zmq.EVENTS)  # take in the agent's subscription while idle
            if not self.sub.poll(50):
                continue
            parts = self.sub.recv_multipart()
            self.frames.append(parts)
            seq = int.from_bytes(parts[1], "big")
            if self.withhold and seq % 5 == 3:
                self.withheld.append(seq)
            else:
                self.pub.send_multipart(parts)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=5)
        self.sub.close(linger=0)
        self.pub.close(linger=0)


def raw_counts(frames: list[list[bytes]]) -> dict[str, object]:
    """The test's own count of vLLM's frames: events by type, hashes stored and removed, and a naive
    replay of the cache (a hash is cached again after it was removed: computed again)."""
    events, mediums = Counter(), Counter()
    stored = removed = recomputed = 0
    live: Counter = Counter()
    seen: set = set()
    for topic, _seq, payload in frames:
        assert topic == b"kv"
        _ts, batch, _rank = msgspec.msgpack.decode(payload)
        for ev in batch:
            events[ev["type"]] += 1
            mediums[ev.get("medium")] += 1
            for hsh in ev.get("block_hashes", []):
                key = (ev.get("group_idx"), hsh)
                if ev["type"] == "BlockStored":
                    stored += 1
                    recomputed += key in seen and live[key] == 0
                    live[key] += 1
                    seen.add(key)
                else:
                    removed += 1
                    live[key] -= 1
    return {"events": dict(events), "mediums": dict(mediums), "stored": stored, "removed": removed,
            "recomputed": recomputed, "cached_now": sum(n for n in live.values() if n > 0)}


def replay_everything(ctx: zmq.Context, replay: str) -> list[list[bytes]]:
    """vLLM's replay buffer from sequence 0, asked by the test itself (vLLM's replay protocol)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    out = []
    try:
        while dealer.poll(10_000):
            parts = dealer.recv_multipart()
            if parts[2] == END_SEQ:
                return out
            out.append(parts[1:])
        raise AssertionError("vLLM's replay endpoint did not answer")
    finally:
        dealer.close(linger=0)


def agent_samples(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:  # noqa: S310
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def lost(samples: dict[tuple[str, tuple], float]) -> dict[str, float]:
    return {dict(labels)["reason"]: v for (name, labels), v in samples.items()
            if name == "infersight_vllm_kv_lost_total" and v}


def settled(samples: dict[tuple[str, tuple], float]) -> float:
    """Batches the agent is done with: applied, or given up on (counted lost by reason)."""
    return samples.get(("infersight_vllm_kv_batches_total", ()), 0) + sum(lost(samples).values())


@pytest.fixture(scope="module")
def run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    logs = tmp_path_factory.mktemp("vllm-kv-live")
    vllm_events, agent_events = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    replay, port, agent_port = f"tcp://127.0.0.1:{free_port()}", free_port(), free_port()
    ctx = zmq.Context()
    agent_log = open(logs / "agent.log", "wb")
    agent = subprocess.Popen([sys.executable, "-m", "infersight", "agent", "--vllm-kv-events", agent_events,
                              "--vllm-kv-replay", replay, "--vllm-kv-replay-timeout", str(REPLAY_TIMEOUT_S),
                              "--listen", f"127.0.0.1:{agent_port}", "--poll-interval", "0.05"],
                             cwd=REPO_ROOT, stdout=agent_log, stderr=subprocess.STDOUT)
    relay = Relay(ctx, vllm_events, agent_events)
    relay.start()
    # Its own server, not the shared one (shared_vllm.py): the test counts every KV event batch from
    # sequence 0 and replays the cache from empty, and the relay must be bound before vLLM publishes.
    # --enforce-eager: no start-up graph capture (shared_vllm.py says why nothing here depends on it).
    config = VllmServerConfig(model=str(tiny_llama), port=port, served_model_name=MODEL, block_size=BLOCK,
                              kv_cache_memory_bytes=8 << 20, max_num_seqs=4, enable_prefix_caching=True,
                              kv_events=vllm_events, kv_events_replay=replay, extra_args=["--enforce-eager"])
    server = VllmServer(config, logs / "vllm.log")
    try:
        server.start().wait_ready(timeout_s=400)
        all_prompts = prompts()
        relay.withhold = True
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda p: complete(server.url, p), all_prompts + all_prompts[:PER_GROUP]))
        time.sleep(0.5)  # the last batches reach the relay
        relay.withhold = False
        statuses.append(complete(server.url, [7] * (2 * BLOCK)))  # its batches pass: the last gap shows
        agent_url = f"http://127.0.0.1:{agent_port}"
        # Done when the agent has settled every frame the relay saw (applied it, or counted it lost:
        # a loss ends the wait at once and fails below, saying so) and no frame came for a second (a
        # frame after the check would make the counts disagree by a race, not by the agent). A scrape
        # showing a batch applied also shows its folds (the agent folds inside the subscriber's poll).
        # The deadline covers the longest replay the agent may run: MAX_REPLAY_TIMEOUTS timeouts.
        deadline, seen, quiet_since = time.monotonic() + MAX_REPLAY_TIMEOUTS * REPLAY_TIMEOUT_S + 30, -1, 0.0
        while time.monotonic() < deadline:
            time.sleep(0.3)
            if len(relay.frames) != seen:
                seen, quiet_since = len(relay.frames), time.monotonic()
            if seen > 0 and settled(agent_samples(agent_url)) >= seen and time.monotonic() - quiet_since >= 1.0:
                break
        yield {"statuses": statuses, "frames": list(relay.frames), "withheld": list(relay.withheld),
               "agent": agent_samples(agent_url), "buffer": replay_everything(ctx, replay)}
    finally:
        server.stop()
        agent.terminate()
        agent.wait(timeout=20)
        agent_log.close()
        relay.close()
        ctx.destroy(linger=0)


def test_the_workload_evicted_and_recomputed_and_the_relay_made_gaps(run: dict) -> None:
    assert set(run["statuses"]) == {200}
    raw = raw_counts(run["frames"])
    assert raw["mediums"] == {"GPU": sum(raw["events"].values())}
    assert raw["removed"] > 0 and raw["recomputed"] > 0 and len(run["withheld"]) >= 2
    # What the relay counted is all vLLM published: its replay buffer holds the same frames, 0..N-1.
    assert [int.from_bytes(f[1], "big") for f in run["frames"]] == list(range(len(run["frames"])))
    assert run["buffer"] == run["frames"]
    print(f"\nkv live: {len(run['frames'])} batches, events {raw['events']}, {raw['stored']} hashes stored, "
          f"{raw['removed']} removed, {raw['recomputed']} recomputed, {len(run['withheld'])} withheld")


def test_the_agents_kv_lifecycle_counts_equal_the_raw_frames(run: dict) -> None:
    raw, a = raw_counts(run["frames"]), run["agent"]
    assert not lost(a), f"the agent gave up on batches it could have replayed: {lost(a)}"

    def counter(name: str, **labels: str) -> float:
        # model_name: the identity label on every engine family (one value per agent, 2eaec1a), not a split.
        want = tuple(sorted(labels.items()))
        return sum(v for (n, got), v in a.items() if n == name and tuple(kv for kv in got if kv[0] != "model_name") == want)

    assert counter("infersight_kv_block_events_total", event="cached") == raw["stored"]
    assert counter("infersight_kv_block_events_total", event="evicted") == raw["removed"]
    assert counter("infersight_kv_block_events_total", event="recomputed") == raw["recomputed"]
    for kind in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        assert counter("infersight_vllm_kv_events_total", type=kind) == raw["events"].get(kind, 0)
    assert counter("infersight_vllm_kv_cached_blocks") == raw["cached_now"]
    # Every eviction of a hash whose store the agent saw is one cached -> evicted age.
    assert counter("infersight_kv_block_age_seconds_count", kind="idle_before_evict") == raw["removed"]


def test_every_withheld_batch_came_back_through_vllms_replay(run: dict) -> None:
    a, withheld = run["agent"], run["withheld"]
    runs = sum(1 for i, seq in enumerate(withheld) if i == 0 or withheld[i - 1] != seq - 1)
    assert a[("infersight_vllm_kv_batches_total", ())] == len(run["frames"]), f"lost by reason: {lost(a)}"
    assert a[("infersight_vllm_kv_replayed_total", ())] == len(withheld)
    assert a[("infersight_vllm_kv_gaps_total", ())] == runs
    assert lost(a) == {}
    assert sum(v for (name, _), v in a.items() if name == "infersight_vllm_kv_malformed_total") == 0
    assert a[("infersight_vllm_kv_publisher_restarts_total", ())] == 0
