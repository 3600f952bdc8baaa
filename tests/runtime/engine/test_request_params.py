"""runtime.engine.request.checked_params: what the engine accepts as sampling parameters from any caller
(the HTTP door, LLM.generate, Engine.add_request), with vLLM's ranges and messages, and how it
normalizes what the sampler cannot take literally (temperature 1e-40, top_p 1e-46)."""
from __future__ import annotations

import pytest

from infersight.runtime import Engine, EngineConfig, ModelConfig, SamplingParams
from infersight.runtime.engine.request import TOP_P_FLOOR, InvalidParamError, checked_params

TINY = ModelConfig("params-tiny", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)


@pytest.mark.parametrize("fields, param, message", [
    ({"max_tokens": 2**32}, "max_tokens",
     "max_tokens=4294967296 cannot be greater than max_model_len=64. Please request fewer output tokens."),
    ({"top_k": 10**30}, "top_k", f"top_k must be at most 2147483647, got {10**30}."),
    ({"top_k": -5}, "top_k", "top_k must be 0 (disable), or at least 1, got -5."),
    ({"top_k": True}, "top_k", "top_k must be an integer, got bool"),
    ({"temperature": float("inf")}, "temperature", "temperature must be a finite number, got inf."),
    ({"temperature": 3.0}, "temperature", "temperature must be in [0, 2], got 3.0."),
    ({"seed": -(2**63) - 1}, "seed",
     f"seed must be in [-9223372036854775808, 9223372036854775807], got {-(2**63) - 1}."),
    ({"task": "\ud800"}, "task", "task is not valid Unicode text (lone surrogate at 0)"),
])
def test_out_of_range_params_name_the_field(fields: dict, param: str, message: str) -> None:
    with pytest.raises(InvalidParamError) as info:
        checked_params(SamplingParams(**fields), 64)
    assert info.value.param == param and str(info.value) == message


def test_normalized_for_the_sampler() -> None:
    p = checked_params(SamplingParams(temperature=1e-40, top_p=1e-46, seed=-1), 64)
    assert (p.temperature, p.top_p, p.seed) == (0.0, TOP_P_FLOOR, None)
    same = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, max_tokens=64, seed=2**63 - 1)
    assert checked_params(same, 64) is same  # nothing to change: the same object


def test_engine_refuses_and_takes_no_request_id() -> None:
    engine = Engine(EngineConfig(model=TINY, num_kv_blocks=8, block_size=8))
    with pytest.raises(InvalidParamError, match="max_tokens=65 cannot be greater than max_model_len=64"):
        engine.add_request("hi", SamplingParams(max_tokens=65))
    assert engine.add_request("hi", SamplingParams(max_tokens=64)) == 0 and len(engine.requests) == 1
