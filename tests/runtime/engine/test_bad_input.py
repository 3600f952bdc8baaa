"""Bad input raises a ValueError subclass whose message names the problem, and never disturbs
the requests an engine is already serving."""
from __future__ import annotations

import math
import random

import pytest
import torch

from infersight.runtime import (
    LLM,
    Engine,
    EngineConfig,
    InvalidRequestError,
    ModelConfig,
    SamplingParams,
    UnknownModelError,
    WeightsError,
)
from infersight.runtime.model.weights import build_model, save_safetensors

MAX_LEN = 64
VOCAB = 259
TINY = ModelConfig("bad-input-moe", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                   n_experts=4, top_k=2, max_seq_len=MAX_LEN)
GOOD = [
    ("hello there", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)),
    ([256, 10, 20, 30, 40], SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)),
]
# Added after the bad ones, without a seed: its sampling seed derives from its request id, so it
# also checks that rejected requests took no id.
LATE = ("late", SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True))


def _engine(**kw: object) -> Engine:
    return Engine(EngineConfig(model=TINY, block_size=8, **kw))  # type: ignore[arg-type]


def _raises(exc: type[ValueError], match: str):
    assert issubclass(exc, ValueError)
    return pytest.raises(exc, match=match)


def _run_to_completion(engine: Engine) -> None:
    for _ in range(1000):
        if not engine.has_unfinished():
            return
        engine.step()
    raise AssertionError("engine did not finish")


@pytest.fixture(scope="module")
def clean_tokens() -> list[list[int]]:
    """The good requests served by an engine that never saw bad input."""
    engine = _engine()
    ids = [engine.add_request(p, sp) for p, sp in GOOD]
    engine.step()
    ids.append(engine.add_request(*LATE))
    _run_to_completion(engine)
    outs = [engine.release(i) for i in ids]
    assert [len(o.token_ids) for o in outs] == [12, 12, 6]
    return [o.token_ids for o in outs]


def test_bad_requests_are_rejected_and_the_engine_keeps_serving(clean_tokens, tmp_path) -> None:
    engine = _engine()
    ids = [engine.add_request(p, sp) for p, sp in GOOD]
    engine.step()
    state = (set(engine.requests), engine.next_request_id, len(engine.scheduler.waiting),
             len(engine.scheduler.running))

    ok = SamplingParams(temperature=0.0, max_tokens=4)
    with _raises(InvalidRequestError, "prompt is empty"):
        engine.add_request("", ok)
    with _raises(InvalidRequestError, "prompt is empty"):
        engine.add_request([], ok)
    # A str prompt gets a BOS token: MAX_LEN - 1 bytes make MAX_LEN tokens, one too many.
    with _raises(InvalidRequestError, f"prompt has {MAX_LEN} tokens.*maximum length is {MAX_LEN}"):
        engine.add_request("a" * (MAX_LEN - 1), ok)
    with _raises(InvalidRequestError, f"prompt has {MAX_LEN + 100} tokens.*maximum length is {MAX_LEN}"):
        engine.add_request([1] * (MAX_LEN + 100), ok)
    for bad_ids in ([1, 2, VOCAB], [1, -1], [300], [1, 2.5], [1, "a"]):
        with _raises(InvalidRequestError, rf"token ids must be integers in \[0, {VOCAB}\)"):
            engine.add_request(bad_ids, ok)  # type: ignore[arg-type]

    for max_tokens in (0, -3):
        with _raises(InvalidRequestError, f"max_tokens must be a positive integer, got {max_tokens}"):
            SamplingParams(max_tokens=max_tokens)
    with _raises(InvalidRequestError, "max_tokens must be a positive integer"):
        SamplingParams(max_tokens=2.5)  # type: ignore[arg-type]
    for temperature in (-0.5, -1e-9, math.nan):
        with _raises(InvalidRequestError, "temperature must be >= 0"):
            SamplingParams(temperature=temperature)
    for top_p in (0.0, 1.5, -0.1, math.nan):
        with _raises(InvalidRequestError, r"top_p must be in \(0, 1\]"):
            SamplingParams(top_p=top_p)
    with _raises(InvalidRequestError, "top_k must be an integer"):
        SamplingParams(top_k=2.5)  # type: ignore[arg-type]

    # Nothing above changed the engine: same requests, same next id, same queues.
    assert (set(engine.requests), engine.next_request_id, len(engine.scheduler.waiting),
            len(engine.scheduler.running)) == state

    # Bad models and weights fail while building another engine; this one is unaffected.
    with _raises(UnknownModelError, "unknown model 'no-such-model'; known models: .*tiny-moe"):
        EngineConfig(model="no-such-model")
    with _raises(UnknownModelError, "unknown model 'no-such-draft'"):
        EngineConfig(model=TINY, speculative_model="no-such-draft")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(random.Random(0).randbytes(4096))
    with _raises(WeightsError, "cannot read .*corrupt.safetensors as safetensors"):
        _engine(weights=corrupt)

    ids.append(engine.add_request(*LATE))
    _run_to_completion(engine)
    outs = [engine.release(i) for i in ids]
    assert [o.token_ids for o in outs] == clean_tokens
    assert all(o.finish_reason == "length" for o in outs)


def test_prompt_at_the_length_limit_is_served() -> None:
    engine = _engine()
    rid = engine.add_request([7] * (MAX_LEN - 1), SamplingParams(temperature=0.0, max_tokens=10))
    _run_to_completion(engine)
    out = engine.release(rid)
    assert len(out.token_ids) == 1 and out.finish_reason == "length"


def test_unknown_model_name() -> None:
    with _raises(UnknownModelError, "unknown model 'gpt-17'"):
        LLM("gpt-17")
    with _raises(UnknownModelError, "unknown model 'gpt-17'"):
        LLM(TINY, speculative_model="gpt-17")


def test_bad_engine_config_values() -> None:
    with _raises(ValueError, "dtype must be one of"):
        EngineConfig(model=TINY, dtype="float8")
    with _raises(ValueError, "attention_backend must be"):
        EngineConfig(model=TINY, attention_backend="magic")
    with _raises(ValueError, "block_size must be >= 1"):
        EngineConfig(model=TINY, block_size=0)
    with _raises(ValueError, "num_kv_blocks=3 cannot hold one max-length sequence"):
        EngineConfig(model=TINY, block_size=8, num_kv_blocks=3)
    other_vocab = ModelConfig("bad-input-vocab", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                              ffn_dim=64, vocab_size=100, max_seq_len=MAX_LEN)
    with _raises(ValueError, "speculative_model must share the target's vocabulary"):
        EngineConfig(model=TINY, speculative_model=other_vocab)
    # A draft shorter than the target would run out of positions mid-generation.
    short = ModelConfig("bad-input-short", d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64,
                        max_seq_len=MAX_LEN // 2)
    with _raises(ValueError, f"speculative_model max_seq_len {MAX_LEN // 2} is shorter than the target's {MAX_LEN}"):
        EngineConfig(model=TINY, speculative_model=short)


def test_corrupt_safetensors(tmp_path) -> None:
    path = tmp_path / "random.safetensors"
    path.write_bytes(torch.randint(0, 256, (10_000,), generator=torch.Generator().manual_seed(3),
                                   dtype=torch.uint8).numpy().tobytes())
    with _raises(WeightsError, "cannot read .*random.safetensors as safetensors"):
        LLM(TINY, weights=path)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with _raises(WeightsError, "cannot read .*empty.safetensors as safetensors"):
        LLM(TINY, weights=empty)
    with _raises(WeightsError, "weights file not found: .*missing.safetensors"):
        LLM(TINY, weights=tmp_path / "missing.safetensors")


def test_mismatched_safetensors(tmp_path) -> None:
    # Same parameter names, different shapes (d_model 32 instead of 64).
    narrow = ModelConfig("bad-input-narrow", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                         n_experts=4, top_k=2, max_seq_len=MAX_LEN)
    path = tmp_path / "narrow.safetensors"
    save_safetensors(build_model(narrow, dtype=torch.float32, device="cpu", seed=0), path)
    with _raises(WeightsError, r"narrow.safetensors: .* has shape \(.*32.*\), model 'bad-input-moe' expects"):
        LLM(TINY, weights=path)
    # Different parameter names: a dense model with one layer instead of a 2-layer MoE.
    dense = ModelConfig("bad-input-dense", d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=128,
                        max_seq_len=MAX_LEN)
    path = tmp_path / "dense.safetensors"
    save_safetensors(build_model(dense, dtype=torch.float32, device="cpu", seed=0), path)
    with _raises(WeightsError, r"dense.safetensors does not match model 'bad-input-moe': missing \['layers\.0\.ffn\."):
        LLM(TINY, weights=path)
    # The draft's weights are checked as well.
    with _raises(WeightsError, r"does not match model 'bad-input-dense'"):
        LLM(TINY, speculative_model=dense, speculative_weights=tmp_path / "narrow.safetensors")
    # And a matching file loads: the same weights as random init with the same seed.
    good = tmp_path / "good.safetensors"
    save_safetensors(build_model(TINY, dtype=torch.float32, device="cpu", seed=0), good)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert LLM(TINY, weights=good).generate(["abc"], params)[0].token_ids == \
        LLM(TINY, seed=0).generate(["abc"], params)[0].token_ids


def test_generate_with_one_bad_prompt_raises_and_llm_still_works() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = ["first prompt", "second", "third one"]
    expected = [o.token_ids for o in LLM(TINY).generate(prompts, params)]

    llm = LLM(TINY)
    for bad in ("", [], [999], "x" * MAX_LEN):
        with _raises(InvalidRequestError, "prompt"):
            llm.generate([prompts[0], prompts[1], bad, prompts[2]], params)  # type: ignore[list-item]
        # All or nothing: the good prompts submitted before the bad one were withdrawn.
        assert not llm.engine.requests and not llm.engine.has_unfinished()
    with _raises(ValueError, "3 prompts but 2 sampling params"):
        llm.generate(prompts, [params, params])
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    assert llm.engine.kv.pool.num_in_use == 0


@pytest.mark.parametrize("field", ["d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                                   "max_seq_len"])
def test_model_config_dimensions_must_be_positive(field: str) -> None:
    dims = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64)
    with pytest.raises(ValueError, match=f"{field} must be a positive integer"):
        ModelConfig("bad-dims", **{**dims, field: 0})
