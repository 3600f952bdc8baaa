"""The one metric catalogue: every metric's name, type, unit, labels, help and derived PromQL.

The Prometheus exporter, the dashboard generator and the docs all read this table; no metric
name is typed anywhere else. Names follow Prometheus conventions: prefix `infersight_`, base
units in the name, `_total` on counters (added by the exposition), no colons. Label sets are
bounded: task labels are capped by the probes' config and again by the agent's (--max-task-labels),
causes, phases and events are enums, and (layer, expert) pairs are capped by the agent's config.
Identity (which model, pod, node) is catalogue.identity's: model_name on the engine's families
(MetricSpec.identity_labels), the rest once on target_info.
"""
from __future__ import annotations

from infersight.exporters.catalogue.spec import (  # noqa: F401  (re-exported)
    LATENCY_BUCKETS, ITL_BUCKETS, BLOCK_AGE_BUCKETS, MetricSpec, P
)
from infersight.exporters.catalogue.identity import (  # noqa: F401  (re-exported)
    MODEL_LABEL, TARGET_LABELS, TARGET_INFO, IDENTITY_METRICS
)
from infersight.exporters.catalogue.engine import (  # noqa: F401  (re-exported)
    REQUESTS, TTFT, ITL, E2E, PHASE, PHASES, SLOW, SLOW_CAUSES, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS,
    REQUESTS_RUNNING, REQUESTS_WAITING, REQUESTS_SWAPPED, STEPS, STEP_DURATION, STEP_TOKENS, ENGINE_SECONDS,
    ENERGY, ENERGY_IDLE, KV_BLOCKS, KV_USAGE, KV_EVENTS, KV_AGE, KV_RECOMPUTED_TOKENS, KV_TRACKING_DROPPED,
    KV_DROP_REASONS, PREFIX_QUERIED, PREFIX_HIT,
    PREFIX_REQUESTS, PREFIX_HIT_REQUESTS, EXPERT_TOKENS, HOT_EXPERT_TOKENS, MOE_IMBALANCE, SPEC_DRAFT,
    SPEC_ACCEPTED, SPEC_VERIFICATIONS, SPEC_POSITION_PROPOSED, SPEC_POSITION_ACCEPTED, SPEC_PREDICTED_SPEEDUP,
    SPEC_ACCEPT_RATE, PROBE_EVENTS, PROBE_DROPPED, PROBE_CORRUPT, PROBE_REJECTED, PROBE_LOST, REQUESTS_ORPHANED,
    ENGINE_METRICS
)
from infersight.exporters.catalogue.gpu import (  # noqa: F401  (re-exported)
    GPU_LABELS, GPU_GR_ENGINE_ACTIVE, GPU_SM_ACTIVE, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE,
    GPU_UTILIZATION, GPU_MEMORY_COPY_UTILIZATION, GPU_POWER, GPU_ENERGY, GPU_MEMORY_USED, GPU_MEMORY_FREE,
    GPU_MEMORY_TOTAL, GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE, GPU_SM_CLOCK, GPU_MEMORY_CLOCK, GPU_PCIE_TX,
    GPU_PCIE_RX, GPU_NVLINK_TX, GPU_NVLINK_RX, GPU_COLLECTOR_ERRORS, GPU_METRICS
)
from infersight.exporters.catalogue.services import (  # noqa: F401  (re-exported)
    OTLP_SPANS_EXPORTED, OTLP_SPANS_DROPPED, TRACING_BUFFER_EVICTED, SERVER_TRACEPARENT_INVALID, SERVER_REJECTED,
    SERVER_REQUESTS_FAILED, SERVER_PROBE_WRITES_FAILED, SERVER_DRAFT_FALLBACKS, HTTP_CONNECTIONS_REFUSED,
    HTTP_CONNECTIONS_OPEN, PROBE_RINGS_HELD, PROBE_RING_ATTACH_SKIPPED, PROBE_RINGS_DEAD, AGENT_POLL_FAILURES,
    AGENT_POLL_DURATION, AGENT_SERVICE_METRICS, TRACING_METRICS, SERVE_METRICS, OTLP_RECEIVER_SPANS,
    OTLP_RECEIVER_SPANS_REJECTED, OTLP_RECEIVER_BODIES_REJECTED, OTLP_REQUEST_SPANS_JOINED,
    OTLP_REQUEST_SPANS_UNJOINED, OTLP_RECEIVER_METRICS, VLLM_KV_EVENTS, VLLM_KV_BATCHES, VLLM_KV_GAPS,
    VLLM_KV_REPLAYED, VLLM_KV_LOST, VLLM_KV_MALFORMED, VLLM_KV_RESTARTS, VLLM_KV_CACHED, VLLM_KV_LEDGER_DROPPED,
    VLLM_KV_METRICS,
    SOURCE_SCRAPES, SOURCE_SCRAPE_ERRORS, CAPTURE_FAILURES, SOURCE_METRICS
)
from infersight.exporters.catalogue.kernels import (  # noqa: F401  (re-exported)
    KERNEL_TIME, KERNEL_ACTIVITIES, KERNEL_SAMPLED_STEPS, KERNEL_STEP_WINDOW, KERNEL_IDLE, KERNEL_FLOPS,
    KERNEL_BYTES, KERNEL_ROOF_TIME, KERNEL_ROOF_FRACTION, KERNEL_PEAK_FLOPS, KERNEL_PEAK_BYTES, RECORDER_WINDOWS,
    RECORDER_OUTCOMES, RECORDER_COST, RECORDER_ENGINE, RECORDER_BUDGET, RECORDER_COST_RATIO, RECORDER_INTERVAL,
    RECORDER_TRIGGERED, RECORDER_REASONS, KERNEL_METRICS
)
from infersight.exporters.catalogue.autoapply import (  # noqa: F401  (re-exported)
    AUTOAPPLY_DECISIONS, AUTOAPPLY_IN_FLIGHT, AUTOAPPLY_SPECULATION, AUTOAPPLY_MAX_NUM_SEQS, AUTOAPPLY_METRICS
)

#: Every metric the agent's state exports and the dashboards may query.
CATALOGUE: tuple[MetricSpec, ...] = ENGINE_METRICS + GPU_METRICS + KERNEL_METRICS


def by_name() -> dict[str, MetricSpec]:
    return {m.name: m for m in CATALOGUE}
