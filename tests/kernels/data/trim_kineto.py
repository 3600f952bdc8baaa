"""Keep whole steps of a Kineto trace: every CPU-side event whose ts falls in "step" ranges
FIRST..LAST (0-based, by start), the GPU events and flows correlated with launches among them, and
the metadata; the shapes file keeps the same steps. Used for kineto_llama-1b-decode-eager-h200.*.

    python tests/kernels/data/trim_kineto.py TRACE.json.gz SHAPES.json FIRST LAST OUT_STEM
"""
from __future__ import annotations

import gzip
import json
import sys

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def main(trace: str, shapes: str, first: int, last: int, out: str) -> None:
    doc = json.load(gzip.open(trace))
    events = doc["traceEvents"]
    steps = sorted((e for e in events if e.get("cat") == "user_annotation" and e.get("name") == "step"),
                   key=lambda e: e["ts"])
    lo, hi = steps[first]["ts"], steps[last]["ts"] + steps[last]["dur"]
    keep, corr = [], set()
    for e in events:
        if e.get("ph") == "M":
            keep.append(e)
        elif e.get("cat") not in GPU_CATS and lo <= e.get("ts", -1) <= hi:
            keep.append(e)
            if e.get("args", {}).get("correlation") is not None:
                corr.add(e["args"]["correlation"])
            if e.get("ph") == "s":
                corr.add(e.get("id"))
    kept = {id(e) for e in keep}
    for e in events:
        if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in corr:
            keep.append(e)
        elif e.get("ph") == "f" and e.get("id") in corr and id(e) not in kept:
            keep.append(e)
    doc["traceEvents"] = keep
    with gzip.open(out + ".json.gz", "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    sh = json.load(open(shapes))
    ids = sorted(s["step_id"] for s in sh["steps"])[first:last + 1]
    sh["steps"] = [s for s in sh["steps"] if s["step_id"] in ids]
    sh["first_step"] = ids[0]
    with open(out + ".shapes.json", "w") as f:
        json.dump(sh, f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
