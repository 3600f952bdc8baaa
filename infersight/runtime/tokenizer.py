"""Byte-level tokenizer: token i < 256 is byte i; three specials follow. Nothing to download."""
from __future__ import annotations


class ByteTokenizer:
    """UTF-8 bytes as tokens, plus BOS, EOS and PAD."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        # Partial UTF-8 sequences (a stream cut mid-character) decode to U+FFFD, never raise.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
