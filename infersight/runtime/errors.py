"""Errors the runtime raises for bad input. All are ValueErrors, so callers can catch one type."""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request (prompt or sampling parameters) the engine cannot serve; other requests go on."""


class UnknownModelError(ValueError):
    """A model name that is not in the table of named configs."""


class WeightsError(ValueError):
    """A safetensors file that is unreadable or does not match the model config."""
