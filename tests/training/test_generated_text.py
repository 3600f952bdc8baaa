"""training.generated_text: every JSON body is lines of JSON objects of the known schemas; a random
creative body uses only the workload's creative alphabet; the same seed gives the same text."""
from __future__ import annotations

import itertools
import json
import random

from infersight.training.generated_text import _CREATIVE_ALPHABET, creative_bodies, json_bodies, word_pool


def test_json_bodies_are_json_lines_of_the_known_schemas() -> None:
    bodies = list(itertools.islice(json_bodies(random.Random(1)), 50))
    keys = {frozenset(json.loads(line)) for body in bodies for line in body.split("\n")}
    known = {frozenset({"ts", "level", "service", "msg", "latency_ms"}),
             frozenset({"order_id", "customer", "items", "total", "currency"}),
             frozenset({"metric", "host", "value", "unit", "labels"})}
    assert known <= keys  # 50 bodies of 2-12 records: every schema drawn
    assert all(2 <= len(body.split("\n")) <= 12 for body in bodies)
    assert bodies == list(itertools.islice(json_bodies(random.Random(1)), 50))


def test_creative_bodies_draw_from_the_alphabet_and_the_word_pool() -> None:
    words = word_pool(["The river's glass ember", "salt 42 wind"])
    assert words == sorted({"The", "river's", "glass", "ember", "salt", "wind"})
    allowed = set(_CREATIVE_ALPHABET) | set("".join(words)) | set(" \n,.;!?-:") | {c.upper() for c in "".join(words)}
    bodies = list(itertools.islice(creative_bodies(random.Random(2), words), 40))
    assert all(set(b) <= allowed for b in bodies)
    assert all(150 <= len(b.rstrip("\n")) for b in bodies)
    assert bodies == list(itertools.islice(creative_bodies(random.Random(2), words), 40))
