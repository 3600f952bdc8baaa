"""max_model_len (vLLM's name): a small KV pool for a long-context model, and clear refusals."""
from __future__ import annotations

import pytest

from infersight.runtime import LLM, EngineConfig, InvalidRequestError, ModelConfig, SamplingParams
from infersight.runtime.engine.engine import Engine

LONG = ModelConfig("mml-dense", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=4096)


def test_default_is_the_models_max_seq_len() -> None:
    config = EngineConfig(model=LONG, num_kv_blocks=256)
    assert config.max_model_len == 4096


def test_small_pool_needs_a_small_max_model_len() -> None:
    with pytest.raises(ValueError, match="num_kv_blocks=99 cannot hold one max-length sequence.*max_model_len=4096"):
        EngineConfig(model=LONG, num_kv_blocks=99)
    config = EngineConfig(model=LONG, num_kv_blocks=8, max_model_len=128)  # 128 / 16 = 8 blocks
    assert config.max_model_len == 128
    # Sized from max_model_len when num_kv_blocks is left out: 8 blocks a sequence, 16 sequences.
    assert EngineConfig(model=LONG, max_model_len=128).num_kv_blocks == 8 * 16


@pytest.mark.parametrize("bad", [0, 1, 4097, -5, 2.5])
def test_out_of_range_max_model_len_is_a_clear_error(bad: object) -> None:
    with pytest.raises(ValueError, match=r"max_model_len must be an integer in \[2, 4096\]"):
        EngineConfig(model=LONG, max_model_len=bad)  # type: ignore[arg-type]


def test_prompts_at_max_model_len_are_refused_and_output_stops_there() -> None:
    engine = Engine(EngineConfig(model=LONG, num_kv_blocks=8, max_model_len=40, block_size=8))
    with pytest.raises(InvalidRequestError, match="prompt has 40 tokens; the maximum length is 40"):
        engine.add_request([1] * 40, SamplingParams(max_tokens=1))
    llm = LLM(LONG, num_kv_blocks=8, max_model_len=40, block_size=8)
    out = llm.generate([[1] * 30], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"  # 30 + 10 = max_model_len


def test_serve_cli_takes_max_model_len() -> None:
    import argparse

    from infersight.commands import serve

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--max-model-len", "512", "--enforce-eager"])
    assert args.max_model_len == 512 and args.enforce_eager
