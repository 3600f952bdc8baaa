"""tokenizer.json for the byte tokenizer (runtime.tokenizer.ByteTokenizer): token i < 256 is byte
i, then <s>, </s> and <pad> at 256, 257 and 258, and BOS before every prompt.

A BPE model without merges over the byte-level alphabet: each byte is written as GPT-2's printable
character for it (the ByteLevel pre-tokenizer's mapping, which the ByteLevel decoder undoes), and
that character's id is the byte's value, so `tokenizers`, transformers and vLLM all encode and
decode a text to the ids the byte tokenizer gives. (A prompt holding the literal text "<s>" is the
one difference: a Hugging Face tokenizer reads it as the special token.)
"""
from __future__ import annotations

from typing import Any

from infersight.runtime.tokenizer import ByteTokenizer

SPECIAL_TOKENS = {"<s>": ByteTokenizer.bos_id, "</s>": ByteTokenizer.eos_id, "<pad>": ByteTokenizer.pad_id}


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the
    others take the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_json() -> dict[str, Any]:
    vocab = {ch: b for b, ch in byte_level_chars().items()} | SPECIAL_TOKENS
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in SPECIAL_TOKENS.items()]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [ByteTokenizer.bos_id], "tokens": ["<s>"]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
