"""An independent, regex-only reading of exposition text, to compute expected values in tests
without going through prometheus_client or infersight's parser."""
from __future__ import annotations

import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
# name{labels} value  -- one sample line; label values in these files hold no '}'.
SAMPLE_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)\s*$")
LABEL = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]*)="(?P<v>[^"]*)"')


def raw_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line, in file order."""
    out = []
    for line in text.splitlines():
        m = SAMPLE_LINE.match(line)
        if m:
            labels = {lm["k"]: lm["v"] for lm in LABEL.finditer(m["labels"])}
            out.append((m["name"], labels, float(m["value"])))
    return out


def raw_value(text: str, name: str, gpu: str = "0", instance: str = "") -> float:
    """The one value of `name` for `gpu` (and MIG `instance`, "" = whole GPU)."""
    hits = [v for n, labels, v in raw_samples(text)
            if n == name and labels.get("gpu") == gpu and labels.get("GPU_I_ID", "") == instance]
    assert len(hits) == 1, (name, gpu, instance, hits)
    return hits[0]
