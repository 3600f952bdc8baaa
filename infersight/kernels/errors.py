"""The one error every reader of a capture file raises (Kineto, nsys, ncu, shapes files, and the
checks in input_files / bounded_run). Import-light on purpose: the CLI names it without loading pandas.
"""
from __future__ import annotations


class TraceError(ValueError):
    """A capture that cannot be analysed (unreadable, truncated, empty, of an unknown kind, over a
    size or time limit, or holding numbers outside what its fields can mean).

    The message is one line for people: it names the file and says what was expected. The CLI
    prints it and exits with code 2."""
