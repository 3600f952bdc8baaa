"""`infersight export-hf`: tiny-moe as Mixtral and tiny-draft as Llama, with a tokenizer.json equal
to the byte tokenizer. Three implementations agree on the export: the engine on the named config,
the engine on the exported directory, and transformers on it give the same greedy tokens."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hf_tiny_checkpoints import needs_transformers
from testkit import one_torch_thread

pytestmark = needs_transformers

PROMPTS = ["def add(a, b):", '{"name": "x", ', "Once upon a time", "héllo wörld 🙂"]
TEXTS = ["", "plain ascii", "héllo wörld 🙂 中文", "tabs\tand\nnewlines  two spaces", "\x00\x7f\xff"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from infersight.cli import main

    root = tmp_path_factory.mktemp("hf_export")
    for name in ("tiny-moe", "tiny-draft"):
        assert main(["export-hf", name, "--out", str(root / name)]) == 0
    return {name: root / name for name in ("tiny-moe", "tiny-draft")}


def test_the_exported_tokenizer_is_the_byte_tokenizer(exported: dict[str, Path]) -> None:
    from transformers import PreTrainedTokenizerFast

    from infersight.runtime.checkpoints.hf_tokenizer import HFTokenizer
    from infersight.runtime.tokenizer import ByteTokenizer

    ours, reference = HFTokenizer(exported["tiny-moe"]), PreTrainedTokenizerFast.from_pretrained(exported["tiny-moe"])
    byte = ByteTokenizer()
    for text in TEXTS:
        assert ours.encode(text) == reference(text).input_ids == byte.encode(text), repr(text)
        assert reference.decode(byte.encode(text), skip_special_tokens=True) == text
    assert ours.eos_ids == byte.eos_ids


@pytest.mark.parametrize(("name", "architecture"), [("tiny-moe", "MixtralForCausalLM"), ("tiny-draft", "LlamaForCausalLM")])
def test_engine_named_engine_exported_and_transformers_agree(exported: dict[str, Path], name: str,
                                                             architecture: str) -> None:
    from transformers import AutoModelForCausalLM

    from infersight.runtime import LLM, SamplingParams

    directory = exported[name]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert type(reference).__name__ == architecture
    with one_torch_thread():
        named = LLM(name, num_kv_blocks=64, max_model_len=256).generate(PROMPTS, params)
        loaded = LLM(str(directory), num_kv_blocks=64, max_model_len=256).generate(PROMPTS, params)
        for a, b in zip(named, loaded):
            assert a.prompt_token_ids == b.prompt_token_ids and a.token_ids == b.token_ids and a.text == b.text
            ids = torch.tensor([a.prompt_token_ids])
            with torch.no_grad():
                want = reference.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
            assert a.token_ids == want
