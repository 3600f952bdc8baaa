"""Fuzzing `infersight serve`'s door: mutated completion and chat bodies through what the server
runs on every request before the engine (the JSON nesting bound, json.loads, parse_completion /
parse_chat with vLLM's ranges), then everything an accepted request meets later: its SERVED and
REQUEST_TEXT probe records, packed by the real ProbeWriter into a stand-in ring and read back
with the strict struct layout, and the error body of a refused one, rendered as the server
renders it. A body is either refused with an APIError whose JSON body encodes, or accepted with
parameters its records hold exactly (no field coerced): never another exception, hang or storm.
"""
from __future__ import annotations

import json
import math
import random
import struct
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

from fuzzkit import case_count, describe, fuzz, mutations
from infersight.http.limits import json_nesting_exceeds
from infersight.probes.records import _LAYOUTS, RecordKind, TextField
from infersight.runtime.engine.request import SAMPLING_EPS
from infersight.serve.api_error import APIError
from infersight.serve.probe_records import ProbeWriter, ServedRecord
from infersight.serve.protocol import parse_chat, parse_completion
from infersight.serve.tracecontext import extract

SEED = 1717
MAX_MODEL_LEN = 256
SEEDS = [json.dumps(b).encode() for b in (
    {"prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 3,
     "user": "u-1", "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": False},
    {"model": "m", "prompt": [256, 10, 20], "max_tokens": 4, "n": 1, "stop": [], "presence_penalty": 0},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "hi \u00e9"}]}], "max_completion_tokens": 16, "temperature": 0, "seed": -1},
    {"messages": [{"role": "user", "content": "x", "name": "bob"}], "max_tokens": 255, "top_p": 1e-46,
     "temperature": 1e-40, "frequency_penalty": 0.0, "min_p": 0, "logprobs": False},
)]
#: Field-level mutations: a body's field set to one of these (most byte-level mutations break the
#: JSON itself, so they only reach json.loads).
FIELDS = ("prompt", "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "seed", "n", "best_of", "stop", "user", "stream", "stream_options", "ignore_eos", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logprobs", "echo", "suffix", "tools",
          "logit_bias", "response_format", "top_logprobs", "stop_token_ids")
VALUES: tuple[Any, ...] = (
    1e-40, 1e-46, 5e-324, 2**32, 2**64, -(2**63) - 1, 2**63, 1e30, -1e30, 10**400, float("nan"), float("inf"),
    -float("inf"), -0.0, "\ud800", "a\udfffb", "", "x" * 2000, [], {}, True, False, None, 0, -1, -2, 0.5, 1, 1.0,
    2, 2.0000001, 255, 256, 257, 2**31 - 1, 2**31, [1, -1], [True], [[1, 2]], ["a", "b"], [""], ["\ud800"],
    [[[[[[1]]]]]], {"include_usage": "\ud800"}, {"include_usage": True}, {"type": "json_object"},
    [{"role": "user", "content": "\ud800"}], [{"role": "user", "content": None}], [{"role": "bot"}],
    [{"role": "user", "content": [{"type": "image"}]}], [{"role": "user", "content": "hi", "name": "\udc00"}])


TEXTS = ("\ud800", "a\udfffb", "\udc00\ud800", "\U0001f600", "\x00", "", "x" * 40_000, "\u2028", "\ufeff")
TEXT_FIELDS = ("prompt", "user", "stop", "suffix", "messages")


def _text_value(key: str, rng: random.Random) -> Any:
    text = rng.choice(TEXTS)
    if key == "messages":
        return [{"role": "user", "content": rng.choice([text, [{"type": "text", "text": text}]])}]
    return [text] if key == "stop" and rng.random() < 0.5 else text


def field_mutations(count: int, seed: int) -> list[bytes]:
    """Bodies with one to three fields set to an awkward value; text fields get awkward text half
    the time (a field picked at random mostly breaks the body elsewhere first)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        body = json.loads(rng.choice(SEEDS))
        for _ in range(1 if rng.random() < 0.6 else rng.randint(2, 3)):
            key = rng.choice(FIELDS)
            value = _text_value(key, rng) if key in TEXT_FIELDS and rng.random() < 0.5 else rng.choice(VALUES)
            body[key] = json.loads(json.dumps(value))  # a lone surrogate as the wire has it: \ud800
        out.append(json.dumps(body).encode())
    return out


SERVED = struct.Struct("<" + "".join(code for _, code in _LAYOUTS[RecordKind.SERVED][1]))


@dataclass
class StandInRing:
    records: list[tuple[int, bytes]] = field(default_factory=list)

    def write(self, kind: int, data: bytes) -> None:
        self.records.append((int(kind), bytes(data)))


@dataclass
class StandInProbe:
    ring: StandInRing = field(default_factory=StandInRing)


def serve_door(data: bytes) -> None:
    if json_nesting_exceeds(data, 64):
        return  # the server's 400 (LimitedApp), before any parser recurses
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return  # the server's 400 invalid_json
    if not isinstance(body, dict):
        return
    for parse in (parse_completion, parse_chat):
        try:
            req = parse(body, "m", 16, MAX_MODEL_LEN)
        except APIError as err:
            rendered = json.loads(JSONResponse(err.body(), status_code=err.status).body)  # must encode
            assert rendered["error"]["message"] and err.status in (400, 404)
            continue
        probe = StandInProbe()
        writer = ProbeWriter(probe, 32 << 10)  # type: ignore[arg-type]
        writer.served(7, ServedRecord(req.operation, 1, extract({}), req.params, req.stream))
        for text_field, text in ((TextField.USER_ID, req.user), (TextField.PROMPT, req.prompt_record)):
            if text:
                writer.text(7, text_field, text)
        kind, packed = probe.ring.records[0]
        assert kind == RecordKind.SERVED
        values = SERVED.unpack(packed)
        p = req.params
        assert values[3:8] == (p.temperature, p.top_p, p.top_k, -1 if p.seed is None else p.seed, p.max_tokens)
        assert math.isfinite(p.temperature) and (p.temperature == 0 or p.temperature >= SAMPLING_EPS)
        assert 0 < p.top_p <= 1 and 1 <= p.max_tokens <= MAX_MODEL_LEN


def test_fuzz_serve_request_bodies() -> None:
    n = case_count()
    cases = mutations(SEEDS, n // 2, SEED) + field_mutations(n - n // 2, SEED)
    failures = fuzz(serve_door, cases, allowed=())
    assert not failures, describe(failures)


def test_the_seeds_are_accepted() -> None:
    """The fuzz starts from bodies the door accepts (else it would only fuzz the refusals)."""
    accepted = 0
    for data in SEEDS:
        body = json.loads(data)
        parse = parse_chat if "messages" in body else parse_completion
        accepted += parse(body, "m", 16, MAX_MODEL_LEN) is not None
    assert accepted == len(SEEDS)
