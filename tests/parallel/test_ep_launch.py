"""The torchrun entry point, as a user runs it: W=2 CPU ranks on gloo, the shipped tiny-moe."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infersight.runtime.engine.engine import Engine
from infersight.runtime.parallel.group import free_port
from infersight.runtime.parallel.generation import GenerationSpec, seeded_prompts, tokens_digest

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.skipif(not TORCHRUN.exists() and shutil.which("torchrun") is None, reason="torchrun not installed")
def test_torchrun_launch_matches_single_process():
    n, length, max_tokens = 3, 12, 8
    cmd = [str(TORCHRUN) if TORCHRUN.exists() else "torchrun", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "infersight.commands.ep_launch", "--model", "tiny-moe", "--device", "cpu",
           "--prompts", str(n), "--prompt-len", str(length), "--max-tokens", str(max_tokens), "--probes"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["world"] == 2 and summary["tokens_identical_across_ranks"] is True
    assert summary["generated_tokens"] == n * max_tokens
    for rank in (0, 1):
        stats = summary[f"rank{rank}"]
        assert 0 < stats["a2a_share"] < 1 and len(stats["bytes_to_peer"]) == 2

    spec = GenerationSpec("tiny-moe", seeded_prompts(n, length, 0), max_tokens)
    engine = Engine(spec.engine_config())
    ids = [engine.add_request(list(p), spec.sampling()) for p in spec.prompts]
    while engine.has_unfinished():
        engine.step()
    assert summary["tokens_digest"] == tokens_digest([engine.release(rid).token_ids for rid in ids])
