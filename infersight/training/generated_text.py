"""The corpus's generated tasks (training.corpus): JSON records from a few fixed schemas, and the
creative task's high-entropy text (random characters of the workload's creative alphabet, word salad
in verse, or the two mixed). Seeded: the same random.Random gives the same text."""
from __future__ import annotations

import json
import random
import re
from typing import Callable, Iterator

from infersight.workload import _json_record


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


_SERVICES = ("api", "auth", "billing", "search", "scheduler", "kv-cache", "router", "worker")
_LEVELS = ("DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR")
_MESSAGES = ("request served", "cache miss", "retrying upstream", "connection reset", "token refreshed",
             "queue full", "batch flushed", "timeout waiting for lock", "user logged in", "config reloaded")
_PRODUCTS = ("widget", "gadget", "sprocket", "gizmo", "doohickey", "bolt", "nut", "washer")
_METRICS = (("gpu_util", "percent"), ("mem_used", "bytes"), ("latency_p99", "ms"), ("tokens_per_s", "1/s"),
            ("kv_blocks_free", "blocks"), ("temperature", "celsius"))
_FIRST = ("ada", "bob", "cy", "dee", "eve", "finn", "gus", "hal", "ivy", "jo")


def _event_record(rng: random.Random) -> str:
    ts = (f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
          f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z")
    return _compact({"ts": ts, "level": rng.choice(_LEVELS), "service": rng.choice(_SERVICES),
                     "msg": rng.choice(_MESSAGES), "latency_ms": rng.randint(1, 2000)})


def _order_record(rng: random.Random) -> str:
    items = [{"sku": f"{rng.choice(_PRODUCTS)}-{rng.randint(1, 99):02d}", "qty": rng.randint(1, 5),
              "price": round(rng.uniform(1, 200), 2)} for _ in range(rng.randint(1, 3))]
    name = rng.choice(_FIRST)
    return _compact({"order_id": f"ORD-{rng.randrange(10**6):06d}",
                     "customer": {"name": name, "email": f"{name}@example.com"}, "items": items,
                     "total": round(sum(i["qty"] * i["price"] for i in items), 2),
                     "currency": rng.choice(("EUR", "USD", "GBP"))})


def _metric_record(rng: random.Random) -> str:
    metric, unit = rng.choice(_METRICS)
    return _compact({"metric": metric, "host": f"node-{rng.randint(0, 15):02d}",
                     "value": round(rng.uniform(0, 100), 3), "unit": unit,
                     "labels": {"gpu": str(rng.randint(0, 7)), "region": rng.choice(("eu", "us", "ap"))}})


# The workload's record (what the demo's json prompts hold) twice as often as each of the others.
_SCHEMAS: tuple[Callable[[random.Random], str], ...] = (_json_record, _json_record, _event_record,
                                                         _order_record, _metric_record)


def json_bodies(rng: random.Random) -> Iterator[str]:
    while True:
        make = rng.choice(_SCHEMAS)
        yield "\n".join(make(rng) for _ in range(rng.randint(2, 12)))


def word_pool(docs: list[str]) -> list[str]:
    words = {w for d in docs for w in re.findall(r"[A-Za-z][A-Za-z']{1,14}", d)}
    return sorted(words) or ["moon", "river", "glass", "ember", "salt", "wind"]


# The characters of infersight.workload's creative prompts.
_CREATIVE_ALPHABET = "abcdefghijklmnopqrstuvwxyz ,.;!?ÆØÅ0123456789"
# Its two-byte letters (all led by byte 0xC3) at a third of the others' rate, so that the lead byte
# is no likelier than any one-byte character: the next byte of this text has no favourite, and a
# draft and its target model, both near uniform here, pick different argmaxes.
_RANDOM_POOL = [c for c in _CREATIVE_ALPHABET if len(c.encode("utf-8")) == 1] * 3 + \
    [c for c in _CREATIVE_ALPHABET if len(c.encode("utf-8")) > 1]


def _random_chars(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_RANDOM_POOL) for _ in range(n))


def creative_bodies(rng: random.Random, words: list[str]) -> Iterator[str]:
    """Random characters (the alphabet of the workload's creative prompts), word salad in verse,
    or the two mixed."""
    punct = (",", ".", ";", "!", "?", " -", ":")
    while True:
        n = rng.randint(150, 1200)
        mode = rng.random()
        if mode < 0.6:
            yield _random_chars(rng, n)
            continue
        out: list[str] = []
        size = 0
        line_len = rng.randint(3, 9)
        i = 0
        while size < n:
            if mode >= 0.85 and rng.random() < 0.4:
                w = _random_chars(rng, rng.randint(2, 10)).strip() or "o"
            else:
                w = rng.choice(words)
                w = w.capitalize() if rng.random() < 0.15 else w.lower()
            if rng.random() < 0.12:
                w += rng.choice(punct)
            i += 1
            sep = " "
            if i % line_len == 0:
                sep = "\n\n" if rng.random() < 0.2 else "\n"
                line_len = rng.randint(3, 9)
                i = 0
            out.append(w + sep)
            size += len(w) + len(sep)
        yield "".join(out).rstrip() + "\n"
