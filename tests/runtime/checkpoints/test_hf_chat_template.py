"""The checkpoint's chat template rendered as transformers' apply_chat_template renders it (text
and tokens), its errors refused as a bad request, and the EOS ids of generation_config.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_tiny_checkpoints import needs_transformers

pytestmark = needs_transformers

CONVERSATIONS = [
    [{"role": "user", "content": "Hello world!"}],
    [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "def add(a, b):"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello. How are you?"},
     {"role": "user", "content": "Fine, thank you. « ünïcode » & <tags>", "meta": {"lang": "en", "n": [1, 2]}}],
]


@pytest.fixture(scope="module")
def both(hf_checkpoints: dict[str, Path]) -> tuple[object, object]:
    from transformers import PreTrainedTokenizerFast

    from infersight.runtime.checkpoints.hf_tokenizer import HFTokenizer

    directory = hf_checkpoints["qwen2"]
    return HFTokenizer(directory), PreTrainedTokenizerFast.from_pretrained(directory)


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one_user", "system", "multi_turn_tojson"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendered_text_is_apply_chat_templates(both: tuple, messages: list, add_generation_prompt: bool) -> None:
    ours, reference = both
    assert ours.chat_template is not None
    want = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.chat_template.render(messages, add_generation_prompt=add_generation_prompt) == want


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one_user", "system", "multi_turn_tojson"])
def test_chat_prompt_tokens_are_apply_chat_templates(both: tuple, messages: list) -> None:
    ours, reference = both
    want = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ours.chat_prompt(messages) == list(want)
    assert ours.chat_prompt(messages)[0] == reference.bos_token_id  # written once, by the template


def test_a_template_error_is_a_bad_request(both: tuple) -> None:
    import jinja2

    from infersight.runtime.errors import InvalidRequestError

    ours, reference = both
    messages = [{"role": "tool", "content": "42"}]
    with pytest.raises(jinja2.TemplateError, match="roles must be user or assistant, got tool"):
        reference.apply_chat_template(messages, tokenize=False)
    with pytest.raises(InvalidRequestError, match="chat template: Conversation roles must be user or assistant, got tool"):
        ours.chat_prompt(messages)


def test_eos_ids_are_generation_configs_list_and_the_engine_stops_on_each(hf_checkpoints: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """A second EOS id in generation_config.json, chosen as the third token greedy decoding makes,
    ends the generation there: the stop comes from the file, not from the tokenizer's eos_token."""
    import shutil

    from infersight.runtime import LLM, SamplingParams

    directory = shutil.copytree(hf_checkpoints["mistral"], tmp_path / "mistral")
    prompt = "The quick brown fox"
    free = LLM(model=str(directory), num_kv_blocks=32, max_model_len=128)
    first = free.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))[0].token_ids
    assert len(first) == 6 and 1 not in first[:3]
    generation = json.loads((directory / "generation_config.json").read_text())
    generation["eos_token_id"] = [1, first[2]]
    (directory / "generation_config.json").write_text(json.dumps(generation))
    stopped = LLM(model=str(directory), num_kv_blocks=32, max_model_len=128)
    assert stopped.engine.tokenizer.eos_ids == {1, first[2]}
    out = stopped.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))[0]
    assert out.token_ids == first[:3 if first[2] not in first[:2] else first.index(first[2]) + 1]
    assert out.finish_reason == "stop"
