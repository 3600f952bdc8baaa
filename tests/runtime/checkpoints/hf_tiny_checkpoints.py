"""Tiny random Hugging Face checkpoints, built once per session with transformers' save_pretrained
and a BPE tokenizer trained offline: the independent reference for runtime.checkpoints.

One per architecture the loader supports, each with 2 layers, hidden 64, GQA (4 query heads, 2 KV
heads), vocabulary 300, and the feature its architecture brings (Llama 3 RoPE scaling and tied
embeddings, Qwen2 QKV bias, Qwen3 QK norm and its own head_dim, Mixtral and Qwen3-MoE experts).
Every parameter is redrawn at random (transformers zeroes biases and sets norms to one, which
would leave their loading untested).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from testkit import needs_service

#: The mark for every test here: transformers (and tokenizers) come with the test extra.
needs_transformers = needs_service(
    "transformers", all(importlib.util.find_spec(m) is not None for m in ("transformers", "tokenizers")),
    "the independent reference; pip install -e '.[test]' (make install-test)")

VOCAB = 300
#: Prompts both engines complete, greedily, MAX_TOKENS tokens at most.
PROMPTS = ["The quick brown fox", "Hello world! How are", "def add(a, b):\n", "Mixture of experts routes every token",
           "An inference engine"]
MAX_TOKENS = 12
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "An inference engine schedules requests, batches tokens and reads the KV cache.",
    "Hello world! How are you today? I am fine, thank you.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "tiny", "layers": 2, "experts": [1, 2, 3, 4]}',
    "Mixture of experts routes every token to its top two experts.",
]
#: A template with what real ones use: bos_token, a system message set apart, raise_exception on a
#: bad role, loop variables, tojson, whitespace control, and the generation prompt.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set offset = 1 %}"
    "<|system|>\n{{ messages[0]['content'] | trim }}\n{% else %}{% set offset = 0 %}{% endif %}"
    "{% for message in messages[offset:] %}"
    "{% if message['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('Conversation roles must be user or assistant, got ' + message['role']) }}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{% if message['role'] == 'assistant' %}{{ eos_token }}"
    "{% endif %}\n{% if loop.last and message.get('meta') %}{{ message['meta'] | tojson }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    assert tok.get_vocab_size() == VOCAB
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(out)


COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              bos_token_id=0, eos_token_id=1, pad_token_id=2)
#: name -> (config class, model class, the config's own fields)
ARCHES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4096)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2,
                                                            intermediate_size=48)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, num_local_experts=4,
                                                               num_experts_per_tok=2, moe_intermediate_size=48,
                                                               norm_topk_prob=False, head_dim=16)),
}


def _randomise(model: Any, seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.ndim == 1:  # biases
                p.copy_(0.2 * noise)
            else:
                p.copy_(0.15 * noise)


def build_checkpoint(out: Path, arch: str, seed: int = 0, **save_kwargs: Any) -> Path:
    import torch
    import transformers

    config_cls, model_cls, own = ARCHES[arch]
    config = getattr(transformers, config_cls)(**{**COMMON, **own})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32)
    _randomise(model, seed)
    model.save_pretrained(out, **save_kwargs)
    _tokenizer(out)
    return out


def transformers_greedy(model: Any, tokenizer: Any, prompt: str) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy new ids) from transformers' generate, stopping at the checkpoint's EOS.

    tokenizer: PreTrainedTokenizerFast.from_pretrained, the class tokenizer_config.json names
    (AutoTokenizer in transformers 5 picks one by the model type, and Qwen2Tokenizer rebuilds
    Qwen's own pre-tokenizer and specials around a vocabulary that was never Qwen's)."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return ids[0].tolist(), out[0, ids.shape[1]:].tolist()
