"""A model's chat template rendered as transformers' apply_chat_template renders it.

The same environment: a sandboxed, immutable jinja2 with trim_blocks and lstrip_blocks, the
loopcontrols extension and a `{% generation %}` block (rendered as its body); tojson without HTML
escaping; raise_exception and strftime_now as globals; and the same variables: messages, tools,
documents, add_generation_prompt and the named special tokens (bos_token, eos_token, ...).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infersight.runtime.checkpoints.model_dir import CHAT_TEMPLATE_FILE
from infersight.runtime.errors import InvalidRequestError


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's tokens for training masks;
    for rendering it is its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def template_source(directory: str | Path, tokenizer_config: Mapping[str, Any]) -> str | None:
    """The default template: chat_template.jinja, else tokenizer_config.json's chat_template (a
    string, or a list of named templates of which "default"); None when the model has none."""
    path = Path(directory) / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    value = tokenizer_config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """render(messages) -> the prompt text; a template error (raise_exception included) is an
    InvalidRequestError: the messages, not the server, are at fault."""

    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.template = _environment().from_string(source)
        self.special_tokens = dict(special_tokens)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        try:
            return self.template.render(messages=list(messages), tools=tools, documents=None,
                                        add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequestError(f"chat template: {exc}") from None
