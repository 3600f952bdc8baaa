"""The tools' results: pydantic models, so that each tool publishes an output schema and a client gets
typed, structured content. Figures keep the agent API's names and units (seconds, joules, tokens);
each result's `provenance` says, per figure, whether it was measured (by what) or modelled (how), in
the agent's own words where the API gives them.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Quantiles(BaseModel):
    p50: float | None = None
    p99: float | None = None


class Summary(BaseModel):
    requests: int = Field(description="finished requests")
    requests_seen: int
    requests_orphaned: int
    ttft_seconds: Quantiles
    e2e_seconds: Quantiles
    itl_mean_seconds: Quantiles
    phases_seconds_total: dict[str, float | None]
    prefix_cache: dict[str, float]
    kv: dict[str, int | None]
    slow_causes: dict[str, int]
    slow_rule: str
    engine_seconds_by_task: dict[str, float]
    energy_j_by_task: dict[str, float]
    dropped_events: int
    lost_events: int
    provenance: dict[str, str]


class RequestRow(BaseModel):
    request_id: int
    trace_id: str
    task: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str
    num_preemptions: int
    queue_s: float | None = None
    prefill_s: float | None = None
    preemption_stall_s: float | None = None
    decode_s: float | None = None
    network_s: float | None = None
    e2e_s: float | None = None
    ttft_s: float | None = None
    itl_mean_s: float | None = None
    engine_seconds: float | None = None
    energy_j: float | None = None
    energy_sampling_bound_j: float | None = None
    gpu_sm_active_s: float | None = None
    gpu_kernel_s: float | None = None
    slow_cause: str = Field("", description="'' (not slow) or the cause")
    slow_detail: str = Field("", description="the numbers behind the cause")
    energy_basis: str | None = None


class SlowestRequests(BaseModel):
    requests: list[RequestRow] = Field(description="longest e2e first")
    slow_rule: str
    provenance: dict[str, str]


class EngineStep(BaseModel):
    step_id: int
    tokens_fed: int
    duration_s: float | None = None
    batch_size: int | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    spec_tokens: int | None = None
    preempted: int | None = None


class KernelShare(BaseModel):
    category: str
    kernel_ns: int
    share: float | None = None


class KernelSummary(BaseModel):
    kernel_ns: int
    top: list[KernelShare] = []


class RequestExplained(RequestRow):
    ttft_parts_s: dict[str, float | None] = Field(description="queue + prefill + stalls and network lead = ttft")
    arrival_wall_s: float | None = None
    first_token_wall_s: float | None = None
    finish_wall_s: float | None = None
    steps: list[EngineStep] = Field(description="the engine steps it was in, as far as the agent still holds them")
    steps_held: int
    kernels: KernelSummary | None = Field(None, description="from a profiler capture that covered it, else null")
    spans: str = Field(description="where its spans are: the trace id in the agent's OTLP backend")
    provenance: dict[str, str]


class Finding(BaseModel):
    kind: str
    message: str
    details: dict[str, Any] = {}


class SpecAdvice(BaseModel):
    task: str
    action: str = Field(description="disable_speculation | keep_speculation | inconclusive")
    speedup: float
    speedup_low: float
    speedup_high: float
    basis: str
    reason: str


class CaptureRoofline(BaseModel):
    capture_id: int
    ring: str
    rows: list[dict[str, Any]] = Field(description="kernels.analysis.report roofline rows (modelled work over measured time)")
    ceilings: dict[str, Any] | None = None


class Roofline(BaseModel):
    last_window_category_shares: dict[str, float] = Field(
        description="the flight recorder's last window: measured kernel time share per op category")
    windows_measured: int | None = None
    captures: list[CaptureRoofline] = []
    note: str


class Diagnosis(BaseModel):
    findings: list[Finding]
    speculation_recommendations: list[SpecAdvice]
    roofline: Roofline
    dropped_events: int
    provenance: dict[str, str]


class SpecTask(BaseModel):
    task: str
    accept_rate: float | None = None
    mean_accepted_length: float | None = None
    gamma: float | None = None
    predicted_speedup: float | None = None
    speedup_interval: list[float | None]
    basis: str
    how: str
    advice: str | None = Field(None, description="the agent's action for this task, null without a prediction")
    advice_reason: str | None = None


class Speculation(BaseModel):
    tasks: list[SpecTask]
    provenance: dict[str, str]


class LayerLoad(BaseModel):
    layer: int
    max_over_mean: float | None = None
    cv: float | None = None
    hot_cold_ratio: float | None = None
    hottest_expert: int | None = None
    tokens: list[int] = Field(description="tokens routed to each expert so far")


class ExpertLoad(BaseModel):
    layers: list[LayerLoad]
    expert_parallel: dict[str, Any] | None = None
    provenance: dict[str, str]


class TaskPair(BaseModel):
    evictor_task: str
    victim_task: str
    evictions: int


class Eviction(BaseModel):
    wall_s: float
    block_id: int
    evictor_request_id: int
    evictor_task: str
    victim_request_id: int = Field(description="-1: unknown (its CACHED record was not seen)")
    victim_task: str


class KvPressure(BaseModel):
    preemptions: int
    evictions: int
    offloads: int
    reloads: int
    recomputed_tokens: int
    blocks_in_use: int | None = None
    blocks_cached: int | None = None
    blocks_total: int | None = None
    usage: float | None = Field(None, description="blocks_in_use / blocks_total at the last step")
    evictions_logged: int = Field(description="evictions the agent joined to their victims")
    by_task_pair: list[TaskPair]
    recent_evictions: list[Eviction]
    provenance: dict[str, str]


class Capture(BaseModel):
    capture_id: int
    ring: str
    steps: int
    tool: str
    reason: str
    requested_wall: float
    state: str = Field(description="requested | running | done | failed")
    path: str = ""
    analysis: dict[str, Any] | None = Field(None, description="kernels.analysis.report: categories, roofline, findings")
    gpu_profiling: str = ""
    decode: str = ""


class Captures(BaseModel):
    captures: list[Capture]
    provenance: dict[str, str]


class WindowStats(BaseModel):
    start_s: float
    end_s: float
    requests: int
    ttft_s: Quantiles
    e2e_s: Quantiles
    itl_mean_s: Quantiles
    phases_seconds_total: dict[str, float]
    slow_causes: dict[str, int]
    tasks: dict[str, int]


class P50Difference(BaseModel):
    b_minus_a: float
    interval_95: list[float]
    relative: float | None = None
    verdict: str


class WindowComparison(BaseModel):
    a: WindowStats
    b: WindowStats
    p50_difference: dict[str, P50Difference | None]
    kept_requests: int
    provenance: dict[str, str]
