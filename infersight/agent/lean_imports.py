"""What the agent process imports, kept to what it uses at steady state (issue 17: RSS <= 150 MB).

pandas imports pyarrow when it is installed, only to learn its version and to back `str` columns
with it; that costs the agent about 35 MB of resident memory, and the agent needs pyarrow only to
write Parquet (--parquet-dir). Without Parquet, pandas is imported while pyarrow is hidden, so its
`str` columns use Python storage (the same `str` dtype and semantics: pandas guarantees that both
storages behave alike); pyarrow stays importable afterwards for whatever asks for it by name.
"""
from __future__ import annotations

import sys


def import_pandas_without_pyarrow() -> bool:
    """Import pandas with pyarrow hidden from it; False (nothing done) when pandas is already loaded
    (a test, or an embedding process) or pyarrow was imported first."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return False
    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # `import pyarrow` now raises ImportError
    try:
        import pandas  # noqa: F401
    finally:
        del sys.modules["pyarrow"]
    return True
