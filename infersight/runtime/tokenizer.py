"""Byte-level tokenizer: token i < 256 is byte i; three specials follow. Nothing to download."""
from __future__ import annotations

import codecs
from typing import Sequence


class ByteStreamDecoder:
    """Text of a growing token sequence: bytes held back until their UTF-8 character is complete."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def step(self, ids: Sequence[int]) -> str:
        return self._utf8.decode(bytes(i for i in ids if i < 256))

    def finish(self) -> str:
        """What a stream cut mid-character leaves (U+FFFD)."""
        return self._utf8.decode(b"", final=True)


class ByteTokenizer:
    """UTF-8 bytes as tokens, plus BOS, EOS and PAD."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    @property
    def eos_ids(self) -> frozenset[int]:
        """The ids that end a request: EOS alone (a property, so a test or a caller that sets eos_id
        on an instance changes what stops generation, as it did before checkpoints brought EOS sets)."""
        return frozenset({self.eos_id})

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        # Partial UTF-8 sequences (a stream cut mid-character) decode to U+FFFD, never raise.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def stream_decoder(self) -> ByteStreamDecoder:
        return ByteStreamDecoder()
