"""Our engine against transformers on tiny random checkpoints of every supported architecture:
the same prompt tokens, the same greedy tokens (float32), and logits within a stated tolerance.

Tolerance: |ours - transformers| <= 1e-4 on every logit of a 2 x 100-token forward, where the
logits reach about 5 and the differences measured 5e-6 to 7.3e-6 (transformers 5.25, torch CPU,
float32). They come from rounding alone: float32 carries about 7 digits, and the two models sum
in different orders (one fused qkv and gate_up matmul against three and two, RoPE tables computed in
float64 then rounded against float32 throughout, our tiled attention against SDPA). 1e-4 leaves
a 14x margin and still fails any real mistake (a missing bias, norm, or scaled frequency moves
logits by 1e-2 or more). Positions run to 100, past the Llama checkpoint's
original_max_position_embeddings of 32, so the llama3 RoPE scaling is in play.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_tiny_checkpoints import ARCHES, MAX_TOKENS, PROMPTS, needs_transformers, transformers_greedy
from testkit import one_torch_thread

LOGIT_ATOL = 1e-4


def _reference(directory: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    return (AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval(),
            PreTrainedTokenizerFast.from_pretrained(directory))


@needs_transformers
@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_greedy_tokens_and_text_are_those_of_transformers(hf_checkpoints: dict[str, Path], arch: str) -> None:
    from infersight.runtime import LLM, SamplingParams

    directory = hf_checkpoints[arch]
    model, tokenizer = _reference(directory)
    with one_torch_thread():
        llm = LLM(model=str(directory), num_kv_blocks=64, max_model_len=256)
        # One batch: prompts of different lengths prefill and decode together over the paged cache.
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
        for prompt, out in zip(PROMPTS, outs):
            prompt_ids, new_ids = transformers_greedy(model, tokenizer, prompt)
            assert out.prompt_token_ids == prompt_ids, prompt
            # transformers pads nothing for a batch of one: its tokens end at EOS or at MAX_TOKENS.
            assert out.token_ids == new_ids, prompt
            assert out.text == tokenizer.decode(new_ids, skip_special_tokens=True)
            assert out.finish_reason == ("stop" if new_ids[-1] in llm.engine.tokenizer.eos_ids else "length")


@needs_transformers
@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_logits_agree_with_transformers_within_the_stated_tolerance(hf_checkpoints: dict[str, Path],
                                                                    arch: str) -> None:
    from infersight.runtime.model.model_config import resolve_model
    from infersight.runtime.model.weights import build_model

    directory = hf_checkpoints[arch]
    model, _ = _reference(directory)
    with one_torch_thread():
        ours = build_model(resolve_model(str(directory)), dtype=torch.float32, device="cpu", seed=0)
        tokens = torch.randint(3, 300, (2, 100), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            got, _ = ours.forward_train(tokens)
            want = model(tokens).logits
    assert got.shape == want.shape
    assert float(want.abs().max()) > 1.0  # logits of a size where 1e-4 is a relative bound near 1e-5
    torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)


def test_named_configs_keep_their_byte_tokenizer_and_shapes() -> None:
    from infersight.runtime import LLM, SamplingParams
    from infersight.runtime.tokenizer import ByteTokenizer

    llm = LLM(model="tiny-draft", num_kv_blocks=32, max_model_len=128)
    assert isinstance(llm.engine.tokenizer, ByteTokenizer)
    out = llm.generate(["hi"], SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert out.prompt_token_ids == [ByteTokenizer.bos_id, *b"hi"]
