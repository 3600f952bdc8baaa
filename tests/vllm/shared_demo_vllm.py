"""The one vLLM serving the demo's trained models (tiny-moe exported as Mixtral, tiny-draft as its
draft model), started as `infersight demo --engine vllm` starts it (demo_vllm.demo_vllm: the same
flags, ring, KV events and profiler), once per session, for the modules that need the trained model:
the demo itself (test_vllm_demo) and the three-engine agreement (test_vllm_three_engines).

Two differences from the demo's own start, both for CI time: the exports go to the session's
temporary folder (not the user's cache), and --enforce-eager skips vLLM's start-up compilation
(shared_vllm.py says why that leaves what infersight observes unchanged; the model's arithmetic is
the same eager or compiled, up to float rounding).

Sharing it is safe because no request is in flight between modules, and a module that starts an
agent first drains the rings (`drain_rings`): the API server's ring keeps what no reader took, and
the expert-count rings of its workers too.
"""
from __future__ import annotations

import os
from pathlib import Path

from infersight.demo_vllm import DemoVllm, demo_vllm
from infersight.probes.ring_consumer import RingConsumer
from infersight.probes.ring_discovery import list_rings
from infersight.vllm.experts import worker_ring_name


def start_demo_moe(root: Path) -> DemoVllm:
    """Export the models and launch without waiting (the caller waits)."""
    vllm = demo_vllm(root, models_cache=root / "hf-export", extra_args=["--enforce-eager"])
    vllm.server.config.cwd = str(root)  # a neutral working directory: see VllmServerConfig.cwd
    vllm.server.start()
    return vllm


def _ours(vllm: DemoVllm, name: str) -> bool:
    """A worker ring of this server: its pid is in the server's process group."""
    try:
        assert vllm.server.proc is not None
        return os.getpgid(int(name.rsplit("-", 1)[1])) == vllm.server.proc.pid
    except (ValueError, ProcessLookupError):
        return False


def drain_rings(vllm: DemoVllm) -> int:
    """Take (and drop) what earlier modules left on this server's rings; returns the records dropped."""
    names = [vllm.ring] + [n for n in list_rings(worker_ring_name(0).removesuffix("0")) if _ours(vllm, n)]
    dropped = 0
    for name in names:
        try:
            consumer = RingConsumer.attach(name)
        except FileNotFoundError:  # not created yet: nothing was written
            continue
        try:
            dropped += sum(len(records) for records in consumer.read().values())
        finally:
            consumer.close()
    return dropped
