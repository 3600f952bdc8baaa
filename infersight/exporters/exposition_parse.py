"""prometheus_client's text parser with every refusal a clear, bounded ValueError.

The parser raises a bare `ValueError()` for some lines (an unquoted label value, a sample whose
name is missing, a `# TYPE` line without a type, an invalid name in a `# TYPE` or `# HELP`
comment) and repeats the whole offending label text in others, however long it is. The scrape
parsers (dcgm-exporter, vLLM /metrics) and `infersight analyze` turn a ValueError into a counted
drop, a warning or a one-line error, so the message must say something and stay short.
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

#: The longest refusal message kept (the rest is summarised by its length).
MAX_MESSAGE_CHARS = 200
UNEXPLAINED = ("a line the Prometheus text parser refused without a reason (an unquoted label value, "
               "a sample without a metric name, or a bad # TYPE / # HELP line)")


def refusal_message(exc: ValueError) -> str:
    """The parser's complaint on one line, at most MAX_MESSAGE_CHARS (plus a count of what was cut)."""
    text = " ".join(" ".join(str(a) for a in exc.args).split()) or UNEXPLAINED
    if len(text) > MAX_MESSAGE_CHARS:
        text = f"{text[:MAX_MESSAGE_CHARS]}... ({len(text) - MAX_MESSAGE_CHARS} more characters)"
    return text


def metric_families(text: str) -> Iterator[Metric]:
    """The families of exposition `text`, lazily, as the parser yields them; ValueError (with
    `refusal_message`) at the first line it refuses."""
    families = text_string_to_metric_families(text)
    while True:
        try:
            family = next(families)
        except StopIteration:
            return
        except ValueError as exc:
            raise ValueError(refusal_message(exc)) from None
        yield family
