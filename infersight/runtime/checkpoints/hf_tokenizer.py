"""A model directory's tokenizer.json through the `tokenizers` library, with its special tokens
and chat template from tokenizer_config.json and its EOS ids from generation_config.json.

The engine's tokenizer interface, which runtime.tokenizer.ByteTokenizer has too: encode(text,
add_bos), decode(ids), eos_ids, stream_decoder(); this one adds chat_prompt(messages).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from infersight.runtime.checkpoints.generation_config import eos_token_ids
from infersight.runtime.checkpoints.model_dir import CHAT_TEMPLATE_FILE, read_json
from infersight.runtime.errors import InvalidRequestError, WeightsError
from infersight.runtime.model.model_config import ModelConfig
from infersight.runtime.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from infersight.runtime.checkpoints.chat_template import ChatTemplate

#: The named special tokens transformers passes to a chat template (its special_tokens_map).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or a serialised AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFStreamDecoder:
    """Text of a growing token sequence, piece by piece: a token that ends mid-character yields
    nothing until the character is complete (tokenizers' DecodeStream). finish() gives what a
    sequence cut mid-character leaves (U+FFFD), so the pieces add up to decode(all ids)."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=True)
        self.ids: list[int] = []
        self.sent = ""

    def step(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        text = "".join(piece for i in ids if (piece := self.stream.step(self.tokenizer, i)) is not None)
        self.sent += text
        return text

    def finish(self) -> str:
        whole = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        return whole[len(self.sent):] if whole.startswith(self.sent) else ""


class HFTokenizer:
    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise WeightsError(f"{path} not found (the engine reads tokenizers' tokenizer.json)")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 -- tokenizers raises its own Exception subclass
            raise WeightsError(f"cannot read {path}: {exc}") from None
        config = read_json(directory, "tokenizer_config.json", required=False)
        self.special_tokens = {name: text for name in SPECIAL_TOKEN_NAMES
                               if (text := _token_text(config.get(name))) is not None}
        eos = self.special_tokens.get("eos_token")
        self.eos_id = self.tokenizer.token_to_id(eos) if eos is not None else None
        self.eos_ids = eos_token_ids(directory, self.eos_id)
        self.chat_template: ChatTemplate | None = None
        if (directory / CHAT_TEMPLATE_FILE).is_file() or config.get("chat_template"):
            # Imported here: jinja2 is paid for by models with a template only.
            from infersight.runtime.checkpoints.chat_template import ChatTemplate, template_source

            source = template_source(directory, config)
            self.chat_template = ChatTemplate(source, self.special_tokens) if source is not None else None

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """add_bos: the tokenizer's special tokens (its post-processor's BOS), as vLLM adds them to a
        completion prompt."""
        return self.tokenizer.encode(text, add_special_tokens=add_bos).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def stream_decoder(self) -> HFStreamDecoder:
        return HFStreamDecoder(self.tokenizer)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The template rendered with the assistant's turn opened, encoded without special tokens
        (the template writes them), as apply_chat_template(tokenize=True) does."""
        if self.chat_template is None:
            raise InvalidRequestError("this model has no chat template; use /v1/completions")
        return self.encode(self.chat_template.render(messages, add_generation_prompt=True), add_bos=False)


def tokenizer_for(cfg: ModelConfig) -> ByteTokenizer | HFTokenizer:
    """The model directory's tokenizer for a checkpoint, else the byte tokenizer of the named configs."""
    return HFTokenizer(cfg.checkpoint) if cfg.checkpoint else ByteTokenizer()
