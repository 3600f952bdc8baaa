"""A range_path, read as phase / layer / op.

The engine's ranges (infersight.runtime.ranges) are "step" > "forward.<phase>" > "layer.<N>.<op>",
with "schedule", "sampling" and "kv.swap_in|out" beside the forwards. Other programs' paths are
read by the same rules, which degrade to "the outermost range" and "the innermost range".

phase   <phase> of the innermost "forward.<phase>" (decode, prefill, mixed, verify, draft); else,
        under "step", the range below it ("sampling", "schedule", "kv.swap_in"; "step" when the
        kernel sits directly in the step); else the outermost range name; "(none)" outside ranges
layer   N of the innermost "layer.N..." range, -1 when none
op      innermost range: "layer.N.<op>" -> <op> (attention, moe.router, moe.experts, mlp); a
        "step" or "forward.*" range -> ""; any other name as is
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

NO_PHASE = "(none)"
_FORWARD = re.compile(r"^forward\.(.+)$")
_LAYER = re.compile(r"^layer\.(\d+)(?:\.(.+))?$")


def split_path(path: str) -> tuple[str, int, str]:
    """(phase, layer, op) of one range_path."""
    if not path:
        return NO_PHASE, -1, ""
    parts = path.split("/")
    phase = ""
    for part in reversed(parts):
        m = _FORWARD.match(part)
        if m:
            phase = m.group(1)
            break
    if not phase:
        if parts[0] == "step":
            phase = parts[1] if len(parts) > 1 else "step"
        else:
            phase = parts[0]
    layer = -1
    for part in reversed(parts):
        m = _LAYER.match(part)
        if m:
            layer = int(m.group(1))
            break
    inner = parts[-1]
    m = _LAYER.match(inner)
    if m:
        op = m.group(2) or ""
    elif inner == "step" or _FORWARD.match(inner):
        op = ""
    else:
        op = inner
    return phase, layer, op


def path_parts(range_path: pd.Series) -> pd.DataFrame:
    """phase, layer, op for each row (index kept), computed once per distinct path."""
    if range_path.empty:
        return pd.DataFrame({"phase": pd.Series(dtype=object), "layer": pd.Series(dtype=np.int64),
                             "op": pd.Series(dtype=object)}, index=range_path.index)
    codes, uniques = pd.factorize(range_path.fillna("").astype(str), sort=False)
    split = [split_path(p) for p in uniques]
    return pd.DataFrame({"phase": np.array([s[0] for s in split], dtype=object)[codes],
                         "layer": np.array([s[1] for s in split], dtype=np.int64)[codes],
                         "op": np.array([s[2] for s in split], dtype=object)[codes]}, index=range_path.index)


def path_components(paths: pd.Series) -> pd.DataFrame:
    """Long format (row, name): each row's distinct range names, for "time by range name"
    aggregations that must not count a name twice when it nests in itself."""
    rows: list[int] = []
    names: list[str] = []
    for i, path in enumerate(paths.fillna("").astype(str)):
        if path:
            for name in dict.fromkeys(path.split("/")):
                rows.append(i)
                names.append(name)
    return pd.DataFrame({"row": np.array(rows, dtype=np.int64), "name": np.array(names, dtype=object)})
