"""Captures on demand (POST /api/v1/capture, bearer token) or by rule (slow TTFT, KV nearly full,
a burst of preemptions), one at a time, rate-limited; the engine is asked through its control
block and the agent picks the trace up when the engine says it is written. An engine reached
another way (vLLM's profiler endpoints: infersight.sources.vllm.profiler) is a CaptureTarget
(sources.capture_target, re-exported here with its outcome and refusal); the same token, rate
limit and one-at-a-time rules apply to it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from infersight.agent.api.token_file import default_token_file, load_or_create_token  # noqa: F401  (re-exported)
from infersight.probes.control import CaptureDecode, CaptureState, CaptureTool, ControlBlock, control_name, default_decode
from infersight.sources.capture_target import CaptureOutcome, CaptureRefused, CaptureTarget  # noqa: F401  (re-exported)

log = logging.getLogger("infersight.agent")


@dataclass
class CaptureRecord:
    capture_id: int
    ring: str
    steps: int
    tool: str
    reason: str
    requested_wall: float
    state: str = "requested"
    path: str = ""
    analysis: dict[str, Any] | None = None
    gpu_profiling: str = ""  # "paused" while the capture ran, or why the agent's counters were not
    decode: str = ""  # "eager" | "graphs": how decode steps ran under the profiler (probes.control.CaptureDecode)


def capture_decode(tool: CaptureTool, decode: str | None) -> CaptureDecode:
    """The decode mode of a request: `decode` by name ("eager" | "graphs"), None the tool's default.
    ValueError for another name."""
    if decode is None:
        return default_decode(tool)
    try:
        return CaptureDecode[decode.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"decode must be 'eager' or 'graphs', got {decode!r}") from None


@dataclass
class CaptureRules:
    """Auto-trigger thresholds; None disables a rule."""

    ttft_p99_s: float | None = None
    kv_usage: float | None = 0.95
    preemptions_per_poll: int | None = None
    cooldown_s: float = 300.0


@dataclass
class CaptureController:
    min_interval_s: float = 30.0
    rules: CaptureRules = field(default_factory=CaptureRules)
    records: list[CaptureRecord] = field(default_factory=list)
    _blocks: dict[str, ControlBlock] = field(default_factory=dict)
    _last_request: float = -1e18
    _last_auto: float = -1e18
    target: CaptureTarget | None = None  # when set, every capture goes to it instead of a ring
    # The flight recorder's current window (agent.recorder.flight_recorder): kept out of `records` (windows
    # come often) and out of the rate limit, but one at a time with every capture.
    window: CaptureRecord | None = None

    def _block(self, ring: str) -> ControlBlock:
        block = self._blocks.get(ring)
        if block is None:
            block = self._blocks[ring] = ControlBlock(control_name(ring), create=False)
        return block

    def request(self, rings: list[str], steps: int, tool: str, reason: str = "api",
                decode: str | None = None) -> CaptureRecord:
        """Ask the engine for a capture. decode: "eager" (per-layer ranges; a torch capture's default)
        or "graphs" (CUDA graphs replayed, kernel activity only); see probes.control.CaptureDecode."""
        if not 1 <= steps <= 1000:
            raise ValueError(f"steps must be in 1..1000, got {steps}")
        try:
            tool_id = CaptureTool[tool.upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"tool must be 'torch' or 'cuda-profiler', got {tool!r}") from None
        decode_id = capture_decode(tool_id, decode)
        if self.target is not None and tool not in self.target.tools:
            raise ValueError(f"{self.target.name} captures with {' or '.join(self.target.tools)} only, "
                             f"not {tool!r}")
        if not rings and self.target is None:
            raise CaptureRefused(503, "no engine attached: no probe ring to send the request to")
        if any(r.state == "running" or r.state == "requested" for r in self.records):
            raise CaptureRefused(409, "a capture is already in progress; one at a time")
        if self.window is not None and self.window.state in ("requested", "running"):
            raise CaptureRefused(409, "a flight-recorder window is in progress (a few steps); retry in a moment")
        now = time.monotonic()
        if now - self._last_request < self.min_interval_s:
            raise CaptureRefused(429, f"captures are rate-limited to one per {self.min_interval_s:.0f} s")
        if self.target is not None:
            return self._request_target(steps, tool, reason, now)
        ring = rings[0]
        try:
            block = self._block(ring)
        except (FileNotFoundError, ValueError) as exc:
            raise CaptureRefused(503, f"the engine behind {ring!r} has no control block: {exc}") from None
        seq = block.request(steps, tool_id, decode_id)
        self._last_request = now
        record = CaptureRecord(seq, ring, steps, tool, reason, time.time(), decode=decode_id.name.lower())
        self.records.append(record)
        log.info("capture %d requested on %s: %d steps with %s (%s)", seq, ring, steps, tool, reason)
        return record

    def _request_target(self, steps: int, tool: str, reason: str, now: float) -> CaptureRecord:
        target = self.target
        assert target is not None
        capture_id = 1 + sum(1 for r in self.records if r.ring == target.name)
        target.start(capture_id, steps)
        self._last_request = now
        record = CaptureRecord(capture_id, target.name, steps, tool, reason, time.time(), state="running")
        self.records.append(record)
        log.info("capture %d requested on %s: %d steps with %s (%s)", capture_id, target.name, steps, tool, reason)
        return record

    def poll(self) -> list[CaptureRecord]:
        """Capture records that finished since the last poll."""
        finished = []
        for record in self.records:
            if record.state not in ("requested", "running"):
                continue
            if self.target is not None and record.ring == self.target.name:
                outcome = self.target.poll()
                if outcome is not None:
                    record.state, record.path, record.analysis = outcome.state, outcome.path, outcome.analysis
                    finished.append(record)
                continue
            block = self._blocks.get(record.ring)
            if block is None or block.ack_seq < record.capture_id:
                continue
            state = block.state
            if state is CaptureState.RUNNING:
                record.state = "running"
            elif state in (CaptureState.DONE, CaptureState.FAILED):
                record.state = state.name.lower()
                record.path = block.path
                finished.append(record)
        return finished

    def in_progress(self) -> list[CaptureRecord]:
        """Captures and the recorder's window that are asked for or running (GPU counters pause for them)."""
        active = [r for r in self.records if r.state in ("requested", "running")]
        if self.window is not None and self.window.state in ("requested", "running"):
            active.append(self.window)
        return active

    def request_window(self, rings: list[str], steps: int, tool: str = "torch-kernels") -> CaptureRecord:
        """A flight-recorder window: like request(), but not rate-limited (the recorder keeps its own
        budget) and not listed in `records`. CaptureRefused while any capture or window is in progress."""
        if self.in_progress():
            raise CaptureRefused(409, "a capture is already in progress; one at a time")
        if self.target is not None:
            capture_id = 1 + sum(1 for r in self.records if r.ring == self.target.name) + (self.window.capture_id
                                                                                            if self.window else 0)
            # A target may read a window's trace more cheaply than a capture's (vLLM: no report built).
            getattr(self.target, "start_window", self.target.start)(capture_id, steps)
            self.window = CaptureRecord(capture_id, self.target.name, steps, "torch", "window", time.time(),
                                        state="running")
            return self.window
        if not rings:
            raise CaptureRefused(503, "no engine attached: no probe ring to send the request to")
        tool_id = CaptureTool[tool.upper().replace("-", "_")]
        # A window measures the engine as it runs: its decode steps replay their CUDA graphs.
        decode_id = CaptureDecode.GRAPHS if tool_id is CaptureTool.TORCH_KERNELS else default_decode(tool_id)
        try:
            block = self._block(rings[0])
        except (FileNotFoundError, ValueError) as exc:
            raise CaptureRefused(503, f"the engine behind {rings[0]!r} has no control block: {exc}") from None
        seq = block.request(steps, tool_id, decode_id)
        self.window = CaptureRecord(seq, rings[0], steps, tool, "window", time.time(), decode=decode_id.name.lower())
        return self.window

    def poll_window(self) -> CaptureRecord | None:
        """The recorder's window once it has ended (done or failed), once; None before."""
        record = self.window
        if record is None or record.state not in ("requested", "running"):
            return None
        if self.target is not None and record.ring == self.target.name:
            outcome = self.target.poll()
            if outcome is None:
                return None
            record.state, record.path, record.analysis = outcome.state, outcome.path, outcome.analysis
            return record
        block = self._blocks.get(record.ring)
        if block is None or block.ack_seq < record.capture_id:
            return None
        if block.state in (CaptureState.DONE, CaptureState.FAILED):
            record.state, record.path = block.state.name.lower(), block.path
            return record
        record.state = "running"
        return None

    def first_step(self, record: CaptureRecord) -> int:
        """The engine step the record's window began with (read before the next capture)."""
        block = self._blocks.get(record.ring)
        return block.first_step if block is not None else 0

    def check_rules(self, rings: list[str], ttft_p99_s: float | None, kv_usage: float | None,
                    preemptions: int) -> CaptureRecord | None:
        """Start a capture when a rule fires and the cool-down has passed."""
        rules, now = self.rules, time.monotonic()
        if now - self._last_auto < rules.cooldown_s:
            return None
        reason = None
        if rules.ttft_p99_s is not None and ttft_p99_s is not None and ttft_p99_s > rules.ttft_p99_s:
            reason = f"ttft p99 {ttft_p99_s:.3f} s > {rules.ttft_p99_s} s"
        elif rules.kv_usage is not None and kv_usage is not None and kv_usage > rules.kv_usage:
            reason = f"kv usage {kv_usage:.0%} > {rules.kv_usage:.0%}"
        elif rules.preemptions_per_poll is not None and preemptions > rules.preemptions_per_poll:
            reason = f"{preemptions} preemptions in one poll > {rules.preemptions_per_poll}"
        if reason is None:
            return None
        try:
            record = self.request(rings, 20, "torch", reason=f"auto: {reason}")
        except CaptureRefused:
            return None
        self._last_auto = now
        return record

    def close(self) -> None:
        for block in self._blocks.values():
            block.close()
        self._blocks = {}
        if self.target is not None:
            self.target.close()
