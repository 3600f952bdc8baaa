"""DCGM's "no data" sentinels, which must never reach a metric or an average.

DCGM marks a value it could not read with a reserved number instead of an error. The values are
defined in DCGM's `dcgm_structs.h` (block DCGM_BLANK_VALUES) and its Python `dcgmvalue.py`
(NVIDIA/DCGM, read at tag v4.6.0); go-dcgm's `pkg/dcgm/const.go` repeats them:

    int32:  DCGM_INT32_BLANK  = 0x7ffffff0 (2147483632), +1 not found, +2 not supported, +3 no permission
    int64:  DCGM_INT64_BLANK  = 0x7ffffffffffffff0 (9223372036854775792), same +1/+2/+3
    double: DCGM_FP64_BLANK   = 2**47 = 140737488355328.0, same +1.0/+2.0/+3.0

(There is no 9.999e30 sentinel in DCGM; 2**47 is the double one.) Old dcgm-exporter releases
printed them verbatim (e.g. 9223372036854775794 = int64 "not supported" for NVLink fields on a
GPU without NVLink; NVIDIA/gpu-monitoring-tools PR #92), so a scrape parser must drop them too.

DCGM's own checks are `value >= BLANK`, which is right for a typed int32/double field. A scraped
number has lost its type, and a legitimate int64 counter (energy in mJ) does pass 2**31 and 2**47,
so here a value is blank only when it is one of the sixteen codes at a blank base (DCGM reserves
BLANK..BLANK+15), or at or above the int64 base.
"""
from __future__ import annotations

import math

INT32_BLANK = 0x7FFFFFF0
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0
_MEANINGS = ("blank", "not found", "not supported", "no permission")
_RESERVED = 16


def blank_meaning(value: float) -> str | None:
    """What a DCGM sentinel means ("blank", "not found", "not supported", "no permission",
    "reserved"), or None when `value` is real data. NaN counts as blank (no data either way)."""
    if math.isnan(value):
        return "blank"
    # Doubles cannot tell 0x7ff...f0 from 0x7ff...f3 apart (all round to 2**63): any of them is blank.
    if value >= float(INT64_BLANK):
        return "blank"
    for base in (INT32_BLANK, FP64_BLANK):
        offset = value - base
        if 0 <= offset < _RESERVED and offset == int(offset):
            return _MEANINGS[int(offset)] if offset < len(_MEANINGS) else "reserved"
    return None


def is_blank(value: float) -> bool:
    """True for a DCGM sentinel (or NaN): the sample must be dropped, not averaged."""
    return blank_meaning(value) is not None
