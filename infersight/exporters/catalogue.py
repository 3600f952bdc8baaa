"""The one metric catalogue: every metric's name, type, unit, labels, help and derived PromQL.

The Prometheus exporter, the dashboard generator and the docs all read this table; no metric
name is typed anywhere else. Names follow Prometheus conventions: prefix `infersight_`, base
units in the name, `_total` on counters (added by the exposition), no colons. Label sets are
bounded: task labels are capped by the probes' config and again by the agent's (--max-task-labels),
causes, phases and events are enums, and (layer, expert) pairs are capped by the agent's config.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)
BLOCK_AGE_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class MetricSpec:
    """name is the family name; counters are exposed as name + "_total"."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] | None = None
    views: dict[str, str] = field(default_factory=dict)  # derived PromQL, by view name
    vllm_name: str | None = None  # the vLLM metric users' dashboards already query, if we have it

    @property
    def sample(self) -> str:
        """The series name a query uses (counters carry _total)."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def rate(self, by: str = "", window: str = "$__rate_interval") -> str:
        inner = f"rate({self.sample}[{window}])"
        return f"sum by ({by}) ({inner})" if by else f"sum({inner})"

    def quantile(self, q: float, by: str = "", window: str = "$__rate_interval") -> str:
        group = f"le, {by}" if by else "le"
        return f"histogram_quantile({q}, sum by ({group}) (rate({self.name}_bucket[{window}])))"


def _latency_views(spec_name: str) -> dict[str, str]:
    return {q: f"histogram_quantile({v}, sum by (le) (rate({spec_name}_bucket[$__rate_interval])))"
            for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def _ratio(num: str, den: str) -> str:
    return f"sum(rate({num}[$__rate_interval])) / clamp_min(sum(rate({den}[$__rate_interval])), 1e-9)"


P = "infersight_"
# -- request level ---------------------------------------------------------------------------
REQUESTS = MetricSpec(P + "requests", "counter", "Finished requests.", ("task", "finish_reason"),
                      vllm_name="vllm:request_success")
TTFT = MetricSpec(P + "time_to_first_token_seconds", "histogram", "Time from arrival to the first output token.",
                  ("task",), "seconds", LATENCY_BUCKETS, _latency_views(P + "time_to_first_token_seconds"),
                  vllm_name="vllm:time_to_first_token_seconds")
ITL = MetricSpec(P + "inter_token_latency_seconds", "histogram", "Time between output tokens, one observation per token.",
                 ("task",), "seconds", ITL_BUCKETS, _latency_views(P + "inter_token_latency_seconds"),
                 vllm_name="vllm:inter_token_latency_seconds")
E2E = MetricSpec(P + "e2e_request_latency_seconds", "histogram", "End-to-end request latency.", ("task",), "seconds",
                 LATENCY_BUCKETS, _latency_views(P + "e2e_request_latency_seconds"),
                 vllm_name="vllm:e2e_request_latency_seconds")
PHASE = MetricSpec(P + "request_phase_seconds", "histogram",
                   "Per-request time by phase; the phases of a request sum to its end-to-end latency.",
                   ("phase", "task"), "seconds", LATENCY_BUCKETS,
                   {"share": f"sum by (phase) (rate({P}request_phase_seconds_sum[$__rate_interval]))"})
PHASES = ("queue", "prefill", "preemption_stall", "decode", "network")
SLOW = MetricSpec(P + "slow_requests", "counter",
                  "Requests flagged slow (above the rolling e2e quantile, p99 by default, or over a latency SLO), "
                  "by attributed cause.", ("cause",))
#: correlate.slow_causes.CAUSES and unattributed.
SLOW_CAUSES = ("queue_wait", "long_prompt", "preemption", "kv_reload", "batch_interference", "speculation_rejections",
               "long_output", "network", "unattributed")
PROMPT_TOKENS = MetricSpec(P + "prompt_tokens", "counter", "Prompt tokens of finished requests.", ("task",),
                           vllm_name="vllm:prompt_tokens")
GENERATION_TOKENS = MetricSpec(P + "generation_tokens", "counter", "Output tokens of finished requests.", ("task",),
                               vllm_name="vllm:generation_tokens")
PREEMPTIONS = MetricSpec(P + "preemptions", "counter", "Requests preempted, by how their KV was handled.",
                         ("reason",), vllm_name="vllm:num_preemptions")
REQUESTS_RUNNING = MetricSpec(P + "requests_running", "gauge", "Requests in the running batch at the last step.",
                              vllm_name="vllm:num_requests_running")
REQUESTS_WAITING = MetricSpec(P + "requests_waiting", "gauge", "Requests waiting to be scheduled at the last step.",
                              vllm_name="vllm:num_requests_waiting")
REQUESTS_SWAPPED = MetricSpec(P + "requests_swapped", "gauge", "Preempted requests whose KV sits in the CPU tier.")
# -- engine steps and cost --------------------------------------------------------------------
STEPS = MetricSpec(P + "steps", "counter", "Engine steps.")
STEP_DURATION = MetricSpec(P + "step_duration_seconds", "histogram", "Engine step duration.", (), "seconds",
                           ITL_BUCKETS, _latency_views(P + "step_duration_seconds"))
STEP_TOKENS = MetricSpec(P + "step_tokens", "counter", "Tokens fed to the model, by kind (prefill, decode, spec).",
                         ("kind",))
ENGINE_SECONDS = MetricSpec(P + "request_engine_seconds", "counter",
                            "Engine step time (wall clock: forward, sampling and host work; not GPU time) of "
                            "finished requests, each step split by token share, by task.", ("task",), "seconds")
ENERGY = MetricSpec(P + "energy_joules", "counter",
                    "GPU energy of finished requests, by task: the GPU's total-energy counter over each engine "
                    "step, split by token share. Fed only where a GPU energy counter is read.", ("task",), "joules",
                    views={"per_output_token": f"sum by (task) (rate({P}energy_joules_total[$__rate_interval])) / "
                           f"clamp_min(sum by (task) (rate({P}generation_tokens_total[$__rate_interval])), 1e-9)"})
ENERGY_IDLE = MetricSpec(P + "energy_idle_joules", "counter",
                         "GPU energy between engine steps (or in steps that ran no request): the part of the "
                         "counter's rise no request is charged for. Fed only where a GPU energy counter is read.",
                         unit="joules")
# -- KV cache ---------------------------------------------------------------------------------
KV_BLOCKS = MetricSpec(P + "kv_blocks", "gauge", "Device KV blocks by state (free, in_use, cached).", ("state",))
KV_USAGE = MetricSpec(P + "kv_cache_usage_ratio", "gauge", "Fraction of device KV blocks in use at the last step.",
                      (), "ratio", vllm_name="vllm:kv_cache_usage_perc")
KV_EVENTS = MetricSpec(P + "kv_block_events", "counter", "KV block transitions.", ("event",),
                       views={"evictions_per_s": f"sum(rate({P}kv_block_events_total{{event=\"evicted\"}}[$__rate_interval]))"})
KV_AGE = MetricSpec(P + "kv_block_age_seconds", "histogram",
                    "KV block ages: lifetime (filled to dropped), idle_before_evict (cached to evicted), "
                    "reuse_gap (cached to prefix hit).", ("kind",), "seconds", BLOCK_AGE_BUCKETS)
KV_RECOMPUTED_TOKENS = MetricSpec(P + "kv_recomputed_tokens", "counter",
                                  "Tokens computed again because their cached KV had been evicted (wasted work).")
# -- prefix cache -----------------------------------------------------------------------------
PREFIX_QUERIED = MetricSpec(P + "prefix_cache_queried_tokens", "counter", "Prompt tokens looked up in the prefix cache.",
                            ("task",), vllm_name="vllm:prefix_cache_queries")
PREFIX_HIT = MetricSpec(P + "prefix_cache_hit_tokens", "counter", "Prompt tokens served from the prefix cache.",
                        ("task",), vllm_name="vllm:prefix_cache_hits",
                        views={"token_hit_rate": _ratio(P + "prefix_cache_hit_tokens_total",
                                                        P + "prefix_cache_queried_tokens_total")})
PREFIX_REQUESTS = MetricSpec(P + "prefix_cache_requests", "counter", "Requests looked up in the prefix cache.", ("task",))
PREFIX_HIT_REQUESTS = MetricSpec(P + "prefix_cache_hit_requests", "counter",
                                 "Requests with at least one prompt block served from the prefix cache.", ("task",),
                                 views={"request_hit_rate": _ratio(P + "prefix_cache_hit_requests_total",
                                                                   P + "prefix_cache_requests_total")})
# -- MoE --------------------------------------------------------------------------------------
EXPERT_TOKENS = MetricSpec(P + "moe_expert_tokens", "counter",
                           "Tokens routed to each expert. Per (layer, expert) while layers x experts is under the "
                           "agent's cap; otherwise layer=\"all\" sums over layers.", ("layer", "expert"))
HOT_EXPERT_TOKENS = MetricSpec(P + "moe_hot_expert_tokens", "gauge",
                               "Tokens routed so far to the top-N hottest (layer, expert) pairs (when over the cap).",
                               ("layer", "expert"))
MOE_IMBALANCE = MetricSpec(P + "moe_layer_imbalance", "gauge",
                           "Expert load imbalance per layer: max_over_mean, cv, hot_cold_ratio.", ("layer", "stat"),
                           unit="ratio")
# -- speculative decoding -------------------------------------------------------------------
SPEC_DRAFT = MetricSpec(P + "spec_draft_tokens", "counter", "Draft tokens proposed.", ("task",),
                        vllm_name="vllm:spec_decode_num_draft_tokens")
SPEC_ACCEPTED = MetricSpec(P + "spec_accepted_tokens", "counter", "Draft tokens accepted.", ("task",),
                           vllm_name="vllm:spec_decode_num_accepted_tokens",
                           views={"accept_rate": "sum by (task) (rate(" + P + "spec_accepted_tokens_total[$__rate_interval]))"
                                  " / clamp_min(sum by (task) (rate(" + P + "spec_draft_tokens_total[$__rate_interval])), 1e-9)"})
SPEC_VERIFICATIONS = MetricSpec(P + "spec_verifications", "counter", "Speculative verifications.", ("task",))
SPEC_POSITION_PROPOSED = MetricSpec(P + "spec_position_proposed", "counter",
                                    "Draft tokens proposed at each position of the window.", ("task", "position"))
SPEC_POSITION_ACCEPTED = MetricSpec(P + "spec_position_accepted", "counter",
                                    "Draft tokens accepted at each position of the window.", ("task", "position"))
SPEC_PREDICTED_SPEEDUP = MetricSpec(P + "spec_predicted_speedup", "gauge",
                                    "Decode speedup of speculation by task, predicted from measured step times: tokens per "
                                    "speculative step over its time against one token per plain probe step over its "
                                    "time at the same batch size (only where plain probe steps were run).", ("task",),
                                    unit="ratio")
SPEC_ACCEPT_RATE = MetricSpec(P + "spec_accept_rate", "gauge", "Acceptance rate alpha so far, by task.", ("task",),
                              unit="ratio")
# -- the probes themselves ------------------------------------------------------------------
PROBE_EVENTS = MetricSpec(P + "probe_events", "counter", "Probe events produced by the engine.", ("ring",))
PROBE_DROPPED = MetricSpec(P + "probe_events_dropped", "counter",
                           "Probe events the engine dropped because the ring was full.", ("ring",))
PROBE_CORRUPT = MetricSpec(P + "probe_events_corrupt", "counter", "Probe records skipped as corrupt.", ("ring",))
PROBE_REJECTED = MetricSpec(P + "probe_records_rejected", "counter",
                            "Probe records the agent read but refused, by reason: a field out of range, an MoE layer "
                            "or expert count over the agent's limits, a task label over --max-task-labels (its "
                            "events count as task \"other\").", ("ring", "reason"))

PROBE_LOST = MetricSpec(P + "probe_events_lost", "counter",
                        "Probe events an agent took off the ring but never delivered: it died before folding "
                        "them in, and its successor on the ring counted them.", ("ring",))
REQUESTS_ORPHANED = MetricSpec(P + "requests_orphaned", "counter",
                               "Finished requests whose ARRIVED event this agent never saw: they started before "
                               "it attached (an agent restart) or their ARRIVED was dropped. Counted here, not "
                               "decomposed into phases or counted in requests_total.")

CATALOGUE: tuple[MetricSpec, ...] = (
    REQUESTS, TTFT, ITL, E2E, PHASE, SLOW, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS, REQUESTS_RUNNING,
    REQUESTS_WAITING, REQUESTS_SWAPPED, STEPS, STEP_DURATION, STEP_TOKENS, ENGINE_SECONDS, ENERGY, ENERGY_IDLE,
    KV_BLOCKS, KV_USAGE,
    KV_EVENTS, KV_AGE, KV_RECOMPUTED_TOKENS, PREFIX_QUERIED, PREFIX_HIT, PREFIX_REQUESTS, PREFIX_HIT_REQUESTS,
    EXPERT_TOKENS, HOT_EXPERT_TOKENS, MOE_IMBALANCE, SPEC_DRAFT, SPEC_ACCEPTED, SPEC_VERIFICATIONS,
    SPEC_POSITION_PROPOSED, SPEC_POSITION_ACCEPTED, SPEC_PREDICTED_SPEEDUP, SPEC_ACCEPT_RATE, PROBE_EVENTS,
    PROBE_DROPPED, PROBE_CORRUPT, PROBE_REJECTED, PROBE_LOST, REQUESTS_ORPHANED,
)


def by_name() -> dict[str, MetricSpec]:
    return {m.name: m for m in CATALOGUE}


# =============================================================================================
# -- GPU telemetry (infersight.gpu): GPU_METRICS, added to CATALOGUE below.
# Each gauge/counter name is "infersight_gpu_" + a field of infersight.gpu.fields, in base units,
# labelled by device index and UUID. Sources: DCGM, dcgm-exporter or NVML (GPM on Hopper+).
# MIG GPU-instance series are kept in the sampler's frames but not exposed under these labels.
# =============================================================================================
GPU_LABELS = ("gpu", "uuid")
GPU_GR_ENGINE_ACTIVE = MetricSpec(P + "gpu_gr_engine_active_ratio", "gauge",
                                  "Fraction of time the graphics/compute engine was active.", GPU_LABELS, "ratio")
GPU_SM_ACTIVE = MetricSpec(P + "gpu_sm_active_ratio", "gauge",
                           "Fraction of time at least one warp was resident on an SM, averaged over SMs.",
                           GPU_LABELS, "ratio")
GPU_SM_OCCUPANCY = MetricSpec(P + "gpu_sm_occupancy_ratio", "gauge",
                              "Resident warps over the maximum warps per SM, averaged over SMs.", GPU_LABELS, "ratio")
GPU_TENSOR_ACTIVE = MetricSpec(P + "gpu_tensor_active_ratio", "gauge",
                               "Fraction of cycles the tensor pipes were active.", GPU_LABELS, "ratio",
                               views={"by_gpu": f"max by (gpu) ({P}gpu_tensor_active_ratio)"})
GPU_DRAM_ACTIVE = MetricSpec(P + "gpu_dram_active_ratio", "gauge",
                             "Fraction of cycles the device memory interface was busy.", GPU_LABELS, "ratio",
                             views={"by_gpu": f"max by (gpu) ({P}gpu_dram_active_ratio)"})
GPU_UTILIZATION = MetricSpec(P + "gpu_utilization_ratio", "gauge",
                             "Fraction of the sample period a kernel was running (coarse: any kernel counts).",
                             GPU_LABELS, "ratio")
GPU_MEMORY_COPY_UTILIZATION = MetricSpec(P + "gpu_memory_copy_utilization_ratio", "gauge",
                                         "Fraction of the sample period device memory was read or written.",
                                         GPU_LABELS, "ratio")
GPU_POWER = MetricSpec(P + "gpu_power_watts", "gauge", "Board power draw.", GPU_LABELS, "watts")
GPU_ENERGY = MetricSpec(P + "gpu_energy_joules", "counter", "GPU energy consumed since the driver loaded.",
                        GPU_LABELS, "joules",
                        views={"watts": f"sum by (gpu) (rate({P}gpu_energy_joules_total[$__rate_interval]))"})
GPU_MEMORY_USED = MetricSpec(P + "gpu_memory_used_bytes", "gauge", "Framebuffer memory in use.", GPU_LABELS, "bytes",
                             views={"used_ratio": f"{P}gpu_memory_used_bytes / {P}gpu_memory_total_bytes"})
GPU_MEMORY_FREE = MetricSpec(P + "gpu_memory_free_bytes", "gauge", "Framebuffer memory free.", GPU_LABELS, "bytes")
GPU_MEMORY_TOTAL = MetricSpec(P + "gpu_memory_total_bytes", "gauge", "Framebuffer memory installed.", GPU_LABELS,
                              "bytes")
GPU_TEMPERATURE = MetricSpec(P + "gpu_temperature_celsius", "gauge", "GPU die temperature.", GPU_LABELS, "celsius")
GPU_MEMORY_TEMPERATURE = MetricSpec(P + "gpu_memory_temperature_celsius", "gauge", "HBM temperature.", GPU_LABELS,
                                    "celsius")
GPU_SM_CLOCK = MetricSpec(P + "gpu_sm_clock_hertz", "gauge", "SM clock.", GPU_LABELS, "hertz")
GPU_MEMORY_CLOCK = MetricSpec(P + "gpu_memory_clock_hertz", "gauge", "Memory clock.", GPU_LABELS, "hertz")
GPU_PCIE_TX = MetricSpec(P + "gpu_pcie_tx_bytes_per_second", "gauge",
                         "PCIe bytes sent by the GPU per second (headers included).", GPU_LABELS, "bytes_per_second")
GPU_PCIE_RX = MetricSpec(P + "gpu_pcie_rx_bytes_per_second", "gauge",
                         "PCIe bytes received by the GPU per second (headers included).", GPU_LABELS,
                         "bytes_per_second")
GPU_NVLINK_TX = MetricSpec(P + "gpu_nvlink_tx_bytes_per_second", "gauge", "NVLink bytes sent per second, all links.",
                           GPU_LABELS, "bytes_per_second")
GPU_NVLINK_RX = MetricSpec(P + "gpu_nvlink_rx_bytes_per_second", "gauge",
                           "NVLink bytes received per second, all links.", GPU_LABELS, "bytes_per_second")
GPU_COLLECTOR_ERRORS = MetricSpec(P + "gpu_collector_errors", "counter",
                                  "Failed GPU telemetry polls (scrape errors, NVML/DCGM errors), by collector.",
                                  ("collector",))

GPU_METRICS: tuple[MetricSpec, ...] = (
    GPU_GR_ENGINE_ACTIVE, GPU_SM_ACTIVE, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE, GPU_UTILIZATION,
    GPU_MEMORY_COPY_UTILIZATION, GPU_POWER, GPU_ENERGY, GPU_MEMORY_USED, GPU_MEMORY_FREE, GPU_MEMORY_TOTAL,
    GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE, GPU_SM_CLOCK, GPU_MEMORY_CLOCK, GPU_PCIE_TX, GPU_PCIE_RX, GPU_NVLINK_TX,
    GPU_NVLINK_RX, GPU_COLLECTOR_ERRORS,
)
# The GPU families are built by infersight.gpu.exposition from the sampler; they are part of the
# one catalogue (dashboards and docs read them from here) like every other metric.
CATALOGUE = CATALOGUE + GPU_METRICS


# =============================================================================================
# -- Tracing (infersight.tracing) and the HTTP server (infersight.serve) -- a separate block;
# TRACING_METRICS and SERVE_METRICS are not yet in CATALOGUE. The agent serves TRACING_METRICS
# (when OTLP export is on) and `infersight serve` serves SERVE_METRICS on its own /metrics.
# =============================================================================================
OTLP_SPANS_EXPORTED = MetricSpec(P + "otlp_spans_exported", "counter", "Spans handed to the OTLP exporter and accepted.")
OTLP_SPANS_DROPPED = MetricSpec(P + "otlp_spans_dropped", "counter",
                                "Spans built but not exported: queue_full (the bounded export queue was full) or "
                                "export_failed (the OTLP endpoint refused them or was unreachable); queue_bytes "
                                "(the queue's byte limit), shutdown (still unsent at the shutdown deadline).",
                                ("reason",))
TRACING_BUFFER_EVICTED = MetricSpec(P + "tracing_buffer_evicted", "counter",
                                    "Entries the tracing hook forgot before their request's spans were built, by "
                                    "buffer (steps, members, served, texts, rows, join_rows, join_spans, ...) and "
                                    "reason (entries: its count limit; bytes: its byte limit).", ("buffer", "reason"))
SERVER_TRACEPARENT_INVALID = MetricSpec(P + "server_traceparent_invalid", "counter",
                                        "Requests with a malformed traceparent header; each started a new trace.")
SERVER_REJECTED = MetricSpec(P + "server_requests_rejected", "counter",
                             "HTTP requests answered with an error before or instead of generating, by reason "
                             "(body_too_large, invalid_json, invalid_request, unknown_model, overloaded, engine_error; "
                             "the HTTP limits: headers_too_large, body_timeout, json_too_deep, client_disconnected).",
                             ("reason",))
SERVER_REQUESTS_FAILED = MetricSpec(P + "server_requests_failed", "counter",
                                    "Accepted requests the engine failed, by scope: request (its own sampling or "
                                    "probes raised; the rest of the batch went on) or step (the whole step raised; "
                                    "every request in flight failed).", ("scope",))
SERVER_PROBE_WRITES_FAILED = MetricSpec(P + "server_probe_writes_failed", "counter",
                                        "Server probe records (SERVED, REQUEST_TEXT, NETWORK) that could not be "
                                        "written; the request itself went on.")

TRACING_METRICS: tuple[MetricSpec, ...] = (OTLP_SPANS_EXPORTED, OTLP_SPANS_DROPPED, TRACING_BUFFER_EVICTED)
SERVE_METRICS: tuple[MetricSpec, ...] = (SERVER_TRACEPARENT_INVALID, SERVER_REJECTED, SERVER_REQUESTS_FAILED,
                                         SERVER_PROBE_WRITES_FAILED)

# -- The agent's OTLP receiver (infersight.tracing.receiver): an engine's own spans (vLLM's), joined
# with the agent's rows. Served by the receiver's collector while --otlp-receiver[-grpc] is on.
OTLP_RECEIVER_SPANS = MetricSpec(P + "otlp_receiver_spans", "counter",
                                 "Spans received from an engine over OTLP and accepted, by transport (http, grpc).",
                                 ("transport",))
OTLP_RECEIVER_SPANS_REJECTED = MetricSpec(P + "otlp_receiver_spans_rejected", "counter",
                                          "Spans refused inside a readable OTLP body (invalid trace or span id), "
                                          "reported back as partial success, by transport.", ("transport",))
OTLP_RECEIVER_BODIES_REJECTED = MetricSpec(P + "otlp_receiver_bodies_rejected", "counter",
                                           "OTLP export requests refused whole, by transport and reason: malformed "
                                           "(did not parse), too_large, unsupported_media_type.",
                                           ("transport", "reason"))
OTLP_REQUEST_SPANS_JOINED = MetricSpec(P + "otlp_request_spans_joined", "counter",
                                       "Engine request spans joined with the agent's row of the same request and "
                                       "exported as one tree.")
OTLP_REQUEST_SPANS_UNJOINED = MetricSpec(P + "otlp_request_spans_unjoined", "counter",
                                         "Requests whose other half never came within the join wait, by the side "
                                         "that came: span (forwarded as received) or row (exported as our own "
                                         "spans).", ("side",))
OTLP_RECEIVER_METRICS: tuple[MetricSpec, ...] = (OTLP_RECEIVER_SPANS, OTLP_RECEIVER_SPANS_REJECTED,
                                                 OTLP_RECEIVER_BODIES_REJECTED, OTLP_REQUEST_SPANS_JOINED,
                                                 OTLP_REQUEST_SPANS_UNJOINED)

# -- vLLM's KV cache events (infersight.sources.vllm_kv_events), served by the agent when it runs with
# --vllm-kv-events. The translated block transitions land in kv_block_events like our engine's; these
# count the stream itself. Batches are vLLM's sequence numbers (one per engine step that changed the
# cache). Not in CATALOGUE: the subscriber's collector renders them (as TRACING_METRICS).
VLLM_KV_EVENTS = MetricSpec(P + "vllm_kv_events", "counter",
                            "vLLM KV cache events applied, by vLLM's type (BlockStored, BlockRemoved, "
                            "AllBlocksCleared).", ("type",))
VLLM_KV_BATCHES = MetricSpec(P + "vllm_kv_batches", "counter",
                             "vLLM KV event batches (sequence numbers) applied, received live or replayed.")
VLLM_KV_GAPS = MetricSpec(P + "vllm_kv_gaps", "counter",
                          "Gaps in the sequence of vLLM KV event batches (each asks the replay endpoint).")
VLLM_KV_REPLAYED = MetricSpec(P + "vllm_kv_replayed", "counter",
                              "vLLM KV event batches recovered from its replay endpoint.")
VLLM_KV_LOST = MetricSpec(P + "vllm_kv_lost", "counter",
                          "vLLM KV event batches never received, by reason (late_join, not_buffered, timeout, "
                          "overflow, restart, no_replay).", ("reason",),
                          views={"lost_ratio": _ratio(P + "vllm_kv_lost_total", P + "vllm_kv_batches_total")})
VLLM_KV_MALFORMED = MetricSpec(P + "vllm_kv_malformed", "counter",
                               "vLLM KV event messages (or events in them) dropped, by reason (frame_count, topic, "
                               "sequence, too_large, payload, unknown_event, event_fields).", ("reason",))
VLLM_KV_RESTARTS = MetricSpec(P + "vllm_kv_publisher_restarts", "counter",
                              "Restarts of vLLM's KV event publisher (its sequence numbers began again).")
VLLM_KV_CACHED = MetricSpec(P + "vllm_kv_cached_blocks", "gauge",
                            "Blocks in vLLM's prefix cache now, as its KV events tell it.")
VLLM_KV_METRICS: tuple[MetricSpec, ...] = (VLLM_KV_EVENTS, VLLM_KV_BATCHES, VLLM_KV_GAPS, VLLM_KV_REPLAYED,
                                           VLLM_KV_LOST, VLLM_KV_MALFORMED, VLLM_KV_RESTARTS, VLLM_KV_CACHED)

# -- An engine's own /metrics scraped by the agent (infersight.sources.vllm_metrics, --vllm-url) and its
# profiler endpoints driven for captures (infersight.sources.vllm_profiler). The scraped values are served
# under the catalogue's names above (exporters.scraped_view); these count the source itself. Not in
# CATALOGUE: the source's collectors render them (as TRACING_METRICS).
SOURCE_SCRAPES = MetricSpec(P + "source_scrapes", "counter", "Scrapes of an engine's metrics endpoint, by source.",
                            ("source",))
SOURCE_SCRAPE_ERRORS = MetricSpec(P + "source_scrape_errors", "counter",
                                  "Failed scrapes of an engine's metrics endpoint, by source and reason (unreachable, "
                                  "timeout, http_status, unparsable, no_engine_metrics).", ("source", "reason"),
                                  views={"error_ratio": _ratio(P + "source_scrape_errors_total",
                                                               P + "source_scrapes_total")})
CAPTURE_FAILURES = MetricSpec(P + "capture_failures", "counter",
                              "Captures that gave no analysable trace, by reason (profiler_http: the engine refused "
                              "or did not answer; no_trace: no trace appeared in the profiler directory in time; "
                              "unreadable: the trace did not parse).", ("reason",))
SOURCE_METRICS: tuple[MetricSpec, ...] = (SOURCE_SCRAPES, SOURCE_SCRAPE_ERRORS, CAPTURE_FAILURES)


# =============================================================================================
# -- The flight recorder (infersight.agent.flight_recorder): sampled kernel windows, its overhead
# budget, and the captures latency objectives and anomalies trigger. KERNEL_METRICS is part of
# CATALOGUE: its counters live in the agent state like the others; its gauges are rendered by
# infersight.exporters.recorder. Kernel series sum over sampled windows only: read them as shares
# and ratios (time by category over all time, idle over step window), not as absolute rates.
# Label values are bounded: category is kernels.categories.CATEGORIES, phase is
# correlate.kernel_windows.WINDOW_PHASES, reason and outcome are the enums below.
# =============================================================================================
def _per(num: str, den: str, by: str) -> str:
    return (f"sum by ({by}) (rate({num}[$__rate_interval])) / "
            f"clamp_min(sum by ({by}) (rate({den}[$__rate_interval])), 1e-9)")


KERNEL_TIME = MetricSpec(P + "kernel_time_seconds", "counter",
                         "Device activity time (kernels, copies; on a CPU engine: op time) in the flight recorder's "
                         "sampled windows, by kernel category and engine phase.", ("category", "phase"), "seconds",
                         views={"share": f"sum by (category) (rate({P}kernel_time_seconds_total[$__rate_interval]))"
                                f" / ignoring(category) group_left sum(rate({P}kernel_time_seconds_total"
                                f"[$__rate_interval]))"})
KERNEL_ACTIVITIES = MetricSpec(P + "kernel_activities", "counter",
                               "Kernels launched (on a CPU engine: op calls) in sampled windows, by phase.", ("phase",))
KERNEL_SAMPLED_STEPS = MetricSpec(P + "kernel_sampled_steps", "counter",
                                  "Engine steps covered by sampled windows, by the phases they ran.", ("phase",),
                                  views={"kernels_per_step": _per(P + "kernel_activities_total",
                                                                  P + "kernel_sampled_steps_total", "phase")})
KERNEL_STEP_WINDOW = MetricSpec(P + "kernel_step_window_seconds", "counter",
                                "Summed step windows of sampled steps (first to last activity of each step and "
                                "phase), by phase.", ("phase",), "seconds")
KERNEL_IDLE = MetricSpec(P + "kernel_idle_seconds", "counter",
                         "Device idle time inside sampled step windows (launch gaps; on a CPU engine: time between "
                         "ops), by phase.", ("phase",), "seconds",
                         views={"gap_share": _per(P + "kernel_idle_seconds_total",
                                                  P + "kernel_step_window_seconds_total", "phase")})
KERNEL_FLOPS = MetricSpec(P + "kernel_modelled_flops", "counter",
                          "FLOPs the roofline model assigns to the sampled steps (kernels.roofline), by category.",
                          ("category",))
KERNEL_BYTES = MetricSpec(P + "kernel_modelled_bytes", "counter",
                          "Bytes the roofline model assigns to the sampled steps, by category.", ("category",), "bytes")
KERNEL_ROOF_TIME = MetricSpec(P + "kernel_roofline_seconds", "counter",
                              "Activity time of the modelled categories in sampled steps (the time the modelled "
                              "FLOPs and bytes took), by category.", ("category",), "seconds",
                              views={"flops_per_second": _per(P + "kernel_modelled_flops_total",
                                                              P + "kernel_roofline_seconds_total", "category"),
                                     "bytes_per_second": _per(P + "kernel_modelled_bytes_total",
                                                              P + "kernel_roofline_seconds_total", "category")})
KERNEL_ROOF_FRACTION = MetricSpec(P + "kernel_roofline_fraction", "gauge",
                                  "Achieved FLOP/s over the roof at the category's arithmetic intensity, in the last "
                                  "window that modelled it (1.0 = on the roofline).", ("category",), "ratio")
KERNEL_PEAK_FLOPS = MetricSpec(P + "kernel_peak_flops_per_second", "gauge",
                               "The compute ceiling the roofline uses, by ceiling name.", ("ceiling",))
KERNEL_PEAK_BYTES = MetricSpec(P + "kernel_peak_bytes_per_second", "gauge",
                               "The memory-bandwidth ceiling the roofline uses, by ceiling name.", ("ceiling",))
RECORDER_WINDOWS = MetricSpec(P + "recorder_windows", "counter",
                              "Flight-recorder windows, by outcome (analysed, failed: no trace or one that did not "
                              "parse, refused: a capture was in progress).", ("outcome",))
#: RECORDER_WINDOWS outcome values.
RECORDER_OUTCOMES = ("analysed", "failed", "refused")
RECORDER_COST = MetricSpec(P + "recorder_cost_seconds", "counter",
                           "Engine time the flight recorder's windows (kind window) and triggered captures (kind "
                           "triggered) cost, measured from step times in and right after them against the steps "
                           "before.", ("kind",), "seconds")
RECORDER_ENGINE = MetricSpec(P + "recorder_engine_seconds", "counter",
                             "Engine step time observed by the flight recorder (steps that ran requests): the "
                             "budget's denominator.", (), "seconds",
                             views={"cost_ratio": f"sum(rate({P}recorder_cost_seconds_total[$__rate_interval])) / "
                                    f"clamp_min(sum(rate({P}recorder_engine_seconds_total[$__rate_interval])), 1e-9)"})
RECORDER_BUDGET = MetricSpec(P + "recorder_budget_ratio", "gauge",
                             "The overhead budget: the share of engine time the flight recorder may cost.", (), "ratio")
RECORDER_COST_RATIO = MetricSpec(P + "recorder_cost_ratio", "gauge",
                                 "Measured cost of the flight recorder since the agent started, over engine time.",
                                 (), "ratio")
RECORDER_INTERVAL = MetricSpec(P + "recorder_window_interval_seconds", "gauge",
                               "Engine seconds between windows that the budget allows at the current cost estimate.",
                               (), "seconds")
RECORDER_TRIGGERED = MetricSpec(P + "recorder_triggered_captures", "counter",
                                "Full captures the flight recorder took on a trigger, by reason.", ("reason",))
#: RECORDER_TRIGGERED reason values (agent.recorder_triggers).
RECORDER_REASONS = ("slo_ttft", "slo_itl", "slo_e2e", "preemption_storm", "step_time_jump")
KERNEL_METRICS: tuple[MetricSpec, ...] = (
    KERNEL_TIME, KERNEL_ACTIVITIES, KERNEL_SAMPLED_STEPS, KERNEL_STEP_WINDOW, KERNEL_IDLE, KERNEL_FLOPS, KERNEL_BYTES,
    KERNEL_ROOF_TIME, KERNEL_ROOF_FRACTION, KERNEL_PEAK_FLOPS, KERNEL_PEAK_BYTES, RECORDER_WINDOWS, RECORDER_COST,
    RECORDER_ENGINE, RECORDER_BUDGET, RECORDER_COST_RATIO, RECORDER_INTERVAL, RECORDER_TRIGGERED,
)
CATALOGUE = CATALOGUE + KERNEL_METRICS
