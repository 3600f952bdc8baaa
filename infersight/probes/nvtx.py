"""NVTX ranges for the engine's phases, visible to Nsight Systems and to torch.profiler.

Backends, chosen once: the `nvtx` package (domain "infersight"; the step range carries the step
id as payload), else torch.cuda.nvtx on a CUDA machine, else none. While a torch.profiler
capture is running, each range is also a record_function of the same name, so a Kineto trace
can be attributed to phases and layers by the same names an nsys timeline shows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch

from infersight.runtime.ranges import RangeMarker

NVTX_DOMAIN = "infersight"


@dataclass
class NvtxBackend:
    name: str
    push: Callable[[str], None]
    push_step: Callable[[int], None]
    pop: Callable[[], None]


def nvtx_package_backend() -> NvtxBackend | None:
    try:
        import nvtx
    except ImportError:
        return None
    domain = nvtx.get_domain(NVTX_DOMAIN)
    attrs: dict[str, Any] = {}

    def push(name: str) -> None:
        attr = attrs.get(name)
        if attr is None:  # event attributes are built once per name: a push is then ~0.1 us
            attr = attrs[name] = domain.get_event_attributes(message=name)
        domain.push_range(attr)

    def push_step(step_id: int) -> None:
        domain.push_range(domain.get_event_attributes(message="step", payload=step_id))

    return NvtxBackend("nvtx", push, push_step, domain.pop_range)


def torch_cuda_backend() -> NvtxBackend | None:
    if not torch.cuda.is_available():
        return None
    push, pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    return NvtxBackend("torch.cuda.nvtx", push, lambda step_id: push("step"), pop)


def _no_push(_: object) -> None:
    return None


def _no_pop() -> None:
    return None


class _Range:
    """One reusable context manager per range name (names are never re-entered while open)."""

    __slots__ = ("name", "owner", "rf", "is_step")

    def __init__(self, name: str, owner: "NvtxRanges") -> None:
        self.name, self.owner, self.rf, self.is_step = name, owner, None, name == "step"

    def __enter__(self) -> None:
        owner = self.owner
        if owner.use_record_function and torch.autograd.profiler._is_profiler_enabled:
            self.rf = torch.profiler.record_function(self.name)
            self.rf.__enter__()
        if self.is_step:
            owner.backend.push_step(owner.step_id)
        else:
            owner.backend.push(self.name)

    def __exit__(self, *exc: object) -> None:
        self.owner.backend.pop()
        if self.rf is not None:
            self.rf.__exit__(None, None, None)
            self.rf = None


class NvtxRanges(RangeMarker):
    """Marks ranges with NVTX (when a backend exists) and, during a capture, record_function."""

    def __init__(self, use_nvtx: bool = True, use_record_function: bool = True) -> None:
        found = (nvtx_package_backend() or torch_cuda_backend()) if use_nvtx else None
        self.backend = found or NvtxBackend("none", _no_push, _no_push, _no_pop)
        self.use_record_function = use_record_function
        self.step_id = 0
        self._ranges: dict[str, _Range] = {}

    def begin_step(self, step_id: int) -> None:
        self.step_id = step_id

    def range(self, name: str) -> ContextManager[None]:
        r = self._ranges.get(name)
        if r is None:
            r = self._ranges[name] = _Range(name, self)
        return r
