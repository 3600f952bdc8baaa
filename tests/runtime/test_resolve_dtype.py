"""runtime.config.resolve_dtype: `--dtype auto` of serve and the benches."""
from __future__ import annotations

import pytest

from infersight.runtime.config import EngineConfig, resolve_dtype


@pytest.mark.parametrize(("dtype", "device", "expected"), [
    ("auto", "cuda", "bfloat16"), ("auto", "cuda:1", "bfloat16"), ("auto", "cpu", "float32"),
    ("float16", "cuda", "float16"), ("float32", "cuda", "float32"), ("bfloat16", "cpu", "bfloat16"),
])
def test_auto_is_bfloat16_on_a_gpu_and_an_explicit_dtype_is_kept(dtype: str, device: str, expected: str) -> None:
    assert resolve_dtype(dtype, device) == expected


def test_the_engine_config_takes_what_it_resolves_to() -> None:
    assert EngineConfig(model="tiny-moe", dtype=resolve_dtype("auto", "cpu")).dtype == "float32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(model="tiny-moe", dtype="auto")
