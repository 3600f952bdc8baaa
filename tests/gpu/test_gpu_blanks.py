"""DCGM blank sentinels, with the constants written out from DCGM's dcgm_structs.h."""
from __future__ import annotations

import pytest

from infersight.gpu.dcgm_blanks import blank_meaning, is_blank


@pytest.mark.parametrize(("value", "meaning"), [
    (2147483632, "blank"), (2147483633, "not found"), (2147483634, "not supported"), (2147483635, "no permission"),
    (2147483647, "reserved"),                                        # int32 0x7ffffff0 .. 0x7fffffff
    (9223372036854775792, "blank"), (9223372036854775794, "blank"),  # int64: indistinguishable as doubles
    (2.0**47, "blank"), (2.0**47 + 1, "not found"), (2.0**47 + 2, "not supported"), (2.0**47 + 3, "no permission"),
    (float("nan"), "blank"),
    (9.999e30, "blank"),  # anything at or above the int64 base: no GPU counter gets there
])
def test_sentinels(value: float, meaning: str) -> None:
    assert blank_meaning(float(value)) == meaning and is_blank(float(value))


@pytest.mark.parametrize("value", [0.0, 1.0, 0.5, 2147483631, 2147483648, 2147483632.5, 2.0**47 + 16, 2.0**47 - 1,
                                   2.0**47 + 0.5, 4742776.0, 1e18, -1.0])
def test_real_values(value: float) -> None:
    # Large counters pass through the sentinel ranges; only the exact codes are blanks.
    assert blank_meaning(float(value)) is None
