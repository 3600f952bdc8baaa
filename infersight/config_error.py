"""ConfigError: a setting a component cannot run with.

Every component's config object raises it from its __post_init__, with one line naming the flag; it is a
ValueError, so the CLI prints that line and exits 2 (cli.py). It sits at the package's root, importing
nothing, so that any part's config may raise it (tests/package/test_import_graph.py: SHARED)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A setting the agent cannot run with."""
