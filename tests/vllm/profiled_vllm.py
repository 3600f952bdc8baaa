"""A real vLLM server with its torch profiler on, for the capture and flight-recorder tests."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testkit import free_port

from infersight.vllm.launch import VllmServer, VllmServerConfig


@contextmanager
def profiled_vllm(model: Path, root: Path, **options: object) -> Iterator[tuple[VllmServer, Path]]:
    """A real vLLM with its torch profiler writing into root/profiles; yields (server, profiles dir)."""
    prof = root / "profiles"
    prof.mkdir()
    config = VllmServerConfig(model=str(model), port=free_port(), profiler_dir=str(prof),
                              served_model_name="tiny-llama", **options)  # type: ignore[arg-type]
    with VllmServer(config, log_path=root / "vllm.log") as server:
        yield server, prof
