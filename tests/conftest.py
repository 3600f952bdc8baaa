"""Puts tests/ on sys.path so test packages can share `testkit`."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
