"""Engine metrics: requests and their phases, steps, KV blocks, prefix cache, MoE experts,
speculative decoding and the probe ring's own health (ENGINE_METRICS). Every one carries the served
model's name as an identity label (model_name, catalogue.identity), as vLLM's own series do."""
from __future__ import annotations

from infersight.exporters.catalogue.identity import MODEL_LABEL
from infersight.exporters.catalogue.spec import LATENCY_BUCKETS, ITL_BUCKETS, BLOCK_AGE_BUCKETS, MetricSpec, latency_views, ratio, P


def _engine_metric(*args: object, **kwargs: object) -> MetricSpec:
    """An engine family: served with model_name (the agent's served model) after its own labels."""
    return MetricSpec(*args, identity_labels=(MODEL_LABEL,), **kwargs)  # type: ignore[arg-type]


# -- request level ---------------------------------------------------------------------------
REQUESTS = _engine_metric(P + "requests", "counter", "Finished requests.", ("task", "finish_reason"),
                      vllm_name="vllm:request_success")
TTFT = _engine_metric(P + "time_to_first_token_seconds", "histogram", "Time from arrival to the first output token.",
                  ("task",), "seconds", LATENCY_BUCKETS, latency_views(P + "time_to_first_token_seconds"),
                  vllm_name="vllm:time_to_first_token_seconds")
ITL = _engine_metric(P + "inter_token_latency_seconds", "histogram", "Time between output tokens, one observation per token.",
                 ("task",), "seconds", ITL_BUCKETS, latency_views(P + "inter_token_latency_seconds"),
                 vllm_name="vllm:inter_token_latency_seconds")
E2E = _engine_metric(P + "e2e_request_latency_seconds", "histogram", "End-to-end request latency.", ("task",), "seconds",
                 LATENCY_BUCKETS, latency_views(P + "e2e_request_latency_seconds"),
                 vllm_name="vllm:e2e_request_latency_seconds")
PHASE = _engine_metric(P + "request_phase_seconds", "histogram",
                   "Per-request time by phase; the phases of a request sum to its end-to-end latency.",
                   ("phase", "task"), "seconds", LATENCY_BUCKETS,
                   {"share": f"sum by (phase) (rate({P}request_phase_seconds_sum[$__rate_interval]))"})
PHASES = ("queue", "prefill", "preemption_stall", "decode", "network")
#: correlate.slow_causes.CAUSES and unattributed.
SLOW_CAUSES = ("host_pause", "queue_wait", "long_prompt", "preemption", "kv_reload", "batch_interference",
               "speculation_rejections", "long_output", "network", "unattributed")
SLOW = _engine_metric(P + "slow_requests", "counter",
                  "Requests flagged slow (above the rolling e2e quantile, p99 by default, or over a latency SLO), "
                  "by attributed cause.", ("cause",), zero_series=tuple((cause,) for cause in SLOW_CAUSES))
PROMPT_TOKENS = _engine_metric(P + "prompt_tokens", "counter", "Prompt tokens of finished requests.", ("task",),
                           vllm_name="vllm:prompt_tokens")
GENERATION_TOKENS = _engine_metric(P + "generation_tokens", "counter", "Output tokens of finished requests.", ("task",),
                               vllm_name="vllm:generation_tokens")
#: runtime.engine.scheduler's preemption modes (vLLM v1 only recomputes).
PREEMPT_REASONS = ("recompute", "swap")
PREEMPTIONS = _engine_metric(P + "preemptions", "counter", "Requests preempted, by how their KV was handled.",
                         ("reason",), vllm_name="vllm:num_preemptions",
                         zero_series=tuple((reason,) for reason in PREEMPT_REASONS))
REQUESTS_RUNNING = _engine_metric(P + "requests_running", "gauge", "Requests in the running batch at the last step.",
                              vllm_name="vllm:num_requests_running")
REQUESTS_WAITING = _engine_metric(P + "requests_waiting", "gauge", "Requests waiting to be scheduled at the last step.",
                              vllm_name="vllm:num_requests_waiting")
REQUESTS_SWAPPED = _engine_metric(P + "requests_swapped", "gauge", "Preempted requests whose KV sits in the CPU tier.")
# -- engine steps and cost --------------------------------------------------------------------
STEPS = _engine_metric(P + "steps", "counter", "Engine steps.")
STEP_DURATION = _engine_metric(P + "step_duration_seconds", "histogram", "Engine step duration.", (), "seconds",
                           ITL_BUCKETS, latency_views(P + "step_duration_seconds"))
STEP_TOKENS = _engine_metric(P + "step_tokens", "counter", "Tokens fed to the model, by kind (prefill, decode, spec).",
                         ("kind",))
ENGINE_SECONDS = _engine_metric(P + "request_engine_seconds", "counter",
                            "Engine step time (wall clock: forward, sampling and host work; not GPU time) of "
                            "finished requests, each step split by token share, by task.", ("task",), "seconds")
ENERGY = _engine_metric(P + "energy_joules", "counter",
                    "GPU energy of finished requests, by task: a modelled split of measured energy (the GPU's "
                    "total-energy counter over each engine step, cut into static and dynamic and split over its "
                    "requests by their dynamic cost: static watts and joules per prefill, decode and draft token "
                    "fitted on the counter's intervals). Fed only where a GPU energy counter is read.",
                    ("task",), "joules",
                    views={"per_output_token": f"sum by (task) (rate({P}energy_joules_total[$__rate_interval])) / "
                           f"clamp_min(sum by (task) (rate({P}generation_tokens_total[$__rate_interval])), 1e-9)"})
#: Python's collector generations (agent.rings.record_limits refuses any other).
HOST_PAUSE_GENERATIONS = ("0", "1", "2")
#: host_pauses' generation for pauses the engine timed but could not keep (its held ones overflowed).
HOST_PAUSE_MISSED = "unknown"
HOST_PAUSE_SECONDS = _engine_metric(P + "host_pause_seconds", "counter",
                                "Time the engine's process stood still in Python garbage collections (each at "
                                "least the probes' host_pause_min_s, 5 ms by default), by generation: measured "
                                "by gc.callbacks in that process. Every request in flight waits it out.",
                                ("generation",), "seconds",
                                zero_series=tuple((g,) for g in HOST_PAUSE_GENERATIONS))
HOST_PAUSES = _engine_metric(P + "host_pauses", "counter",
                         "Garbage collections that stalled the engine's process (each at least the probes' "
                         "host_pause_min_s), by generation (\"unknown\": timed but pushed out of the engine's "
                         "held pauses before it could write them).", ("generation",),
                         zero_series=tuple((g,) for g in HOST_PAUSE_GENERATIONS))
ENERGY_IDLE = _engine_metric(P + "energy_idle_joules", "counter",
                         "GPU energy between engine steps (or in steps that ran no request): the part of the "
                         "counter's rise no request is charged for. Fed only where a GPU energy counter is read.",
                         unit="joules")
# -- KV cache ---------------------------------------------------------------------------------
KV_BLOCKS = _engine_metric(P + "kv_blocks", "gauge", "Device KV blocks by state (free, in_use, cached).", ("state",))
KV_USAGE = _engine_metric(P + "kv_cache_usage_ratio", "gauge", "Fraction of device KV blocks in use at the last step.",
                      (), "ratio", vllm_name="vllm:kv_cache_usage_perc")
KV_EVENTS = _engine_metric(P + "kv_block_events", "counter", "KV block transitions.", ("event",),
                       views={"evictions_per_s": f"sum(rate({P}kv_block_events_total{{event=\"evicted\"}}[$__rate_interval]))"})
KV_AGE = _engine_metric(P + "kv_block_age_seconds", "histogram",
                    "KV block ages: lifetime (filled to dropped), idle_before_evict (cached to evicted), "
                    "reuse_gap (cached to prefix hit).", ("kind",), "seconds", BLOCK_AGE_BUCKETS)
KV_RECOMPUTED_TOKENS = _engine_metric(P + "kv_recomputed_tokens", "counter",
                                  "Tokens computed again because their cached KV had been evicted (wasted work).")
KV_TRACKING_DROPPED = _engine_metric(P + "kv_tracking_dropped", "counter",
                                 "KV rows the agent let go at its bounds, oldest first, by reason: open_events (a "
                                 "block's open event: it gets no age when it closes), reloads (a reload of a request "
                                 "in flight: not seen by the slow-request attribution).", ("reason",))
#: kv_tracking_dropped's reasons (agent.folds.kv.KvLimits).
KV_DROP_REASONS = ("open_events", "reloads")
# -- prefix cache -----------------------------------------------------------------------------
PREFIX_QUERIED = _engine_metric(P + "prefix_cache_queried_tokens", "counter", "Prompt tokens looked up in the prefix cache.",
                            ("task",), vllm_name="vllm:prefix_cache_queries")
PREFIX_HIT = _engine_metric(P + "prefix_cache_hit_tokens", "counter", "Prompt tokens served from the prefix cache.",
                        ("task",), vllm_name="vllm:prefix_cache_hits",
                        views={"token_hit_rate": ratio(P + "prefix_cache_hit_tokens_total",
                                                        P + "prefix_cache_queried_tokens_total")})
PREFIX_REQUESTS = _engine_metric(P + "prefix_cache_requests", "counter", "Requests looked up in the prefix cache.", ("task",))
PREFIX_HIT_REQUESTS = _engine_metric(P + "prefix_cache_hit_requests", "counter",
                                 "Requests with at least one prompt block served from the prefix cache.", ("task",),
                                 views={"request_hit_rate": ratio(P + "prefix_cache_hit_requests_total",
                                                                   P + "prefix_cache_requests_total")})
# -- MoE --------------------------------------------------------------------------------------
EXPERT_TOKENS = _engine_metric(P + "moe_expert_tokens", "counter",
                           "Tokens routed to each expert. Per (layer, expert) while layers x experts is under the "
                           "agent's cap; otherwise layer=\"all\" sums over layers.", ("layer", "expert"))
HOT_EXPERT_TOKENS = _engine_metric(P + "moe_hot_expert_tokens", "gauge",
                               "Tokens routed so far to the top-N hottest (layer, expert) pairs (the agent's top_hot_pairs), "
                               "whether or not each pair has its own expert-token series.",
                               ("layer", "expert"))
MOE_IMBALANCE = _engine_metric(P + "moe_layer_imbalance", "gauge",
                           "Expert load imbalance per layer: max_over_mean, cv, hot_cold_ratio.", ("layer", "stat"),
                           unit="ratio")
# -- speculative decoding -------------------------------------------------------------------
SPEC_DRAFT = _engine_metric(P + "spec_draft_tokens", "counter", "Draft tokens proposed.", ("task",),
                        vllm_name="vllm:spec_decode_num_draft_tokens")
SPEC_ACCEPTED = _engine_metric(P + "spec_accepted_tokens", "counter", "Draft tokens accepted.", ("task",),
                           vllm_name="vllm:spec_decode_num_accepted_tokens",
                           views={"accept_rate": "sum by (task) (rate(" + P + "spec_accepted_tokens_total[$__rate_interval]))"
                                  " / clamp_min(sum by (task) (rate(" + P + "spec_draft_tokens_total[$__rate_interval])), 1e-9)"})
SPEC_VERIFICATIONS = _engine_metric(P + "spec_verifications", "counter", "Speculative verifications.", ("task",))
SPEC_POSITION_PROPOSED = _engine_metric(P + "spec_position_proposed", "counter",
                                    "Draft tokens proposed at each position of the window.", ("task", "position"))
SPEC_POSITION_ACCEPTED = _engine_metric(P + "spec_position_accepted", "counter",
                                    "Draft tokens accepted at each position of the window.", ("task", "position"))
SPEC_PREDICTED_SPEEDUP = _engine_metric(P + "spec_predicted_speedup", "gauge",
                                    "Decode speedup of speculation by task, predicted from measured step times: tokens per "
                                    "speculative step over its time against one token per plain probe step over its "
                                    "time at the same batch size (only where plain probe steps were run).", ("task",),
                                    unit="ratio")
SPEC_ACCEPT_RATE = _engine_metric(P + "spec_accept_rate", "gauge", "Acceptance rate alpha so far, by task.", ("task",),
                              unit="ratio")
# -- the probes themselves ------------------------------------------------------------------
# The ring's own accounting counts slots ("events"): a slot holds one record, or several of a step's
# TOKENS or batch members (probes.record_batches), so records outnumber these.
PROBE_EVENTS = _engine_metric(P + "probe_events", "counter",
                          "Probe ring slots produced by the engine (a slot holds one record, or a step's TOKENS or "
                          "batch members many to a slot: records outnumber slots).", ("ring",))
PROBE_DROPPED = _engine_metric(P + "probe_events_dropped", "counter",
                           "Probe ring slots the engine dropped because the ring was full.", ("ring",))
PROBE_CORRUPT = _engine_metric(P + "probe_events_corrupt", "counter", "Probe ring slots skipped as corrupt.", ("ring",))
PROBE_REJECTED = _engine_metric(P + "probe_records_rejected", "counter",
                            "Probe records the agent read but refused, by reason: a field out of range, an MoE layer "
                            "or expert count over the agent's limits, a task label over --max-task-labels (its "
                            "events count as task \"other\").", ("ring", "reason"))

PROBE_LOST = _engine_metric(P + "probe_events_lost", "counter",
                        "Probe events an agent took off the ring but never delivered: it died before folding "
                        "them in, and its successor on the ring counted them.", ("ring",))
REQUESTS_ORPHANED = _engine_metric(P + "requests_orphaned", "counter",
                               "Finished requests whose ARRIVED event this agent never saw: they started before "
                               "it attached (an agent restart) or their ARRIVED was dropped. Counted here, not "
                               "decomposed into phases or counted in requests_total.", zero_series=((),))

ENGINE_METRICS: tuple[MetricSpec, ...] = (
    REQUESTS, TTFT, ITL, E2E, PHASE, SLOW, PROMPT_TOKENS, GENERATION_TOKENS, PREEMPTIONS, REQUESTS_RUNNING,
    REQUESTS_WAITING, REQUESTS_SWAPPED, STEPS, STEP_DURATION, STEP_TOKENS, ENGINE_SECONDS, HOST_PAUSE_SECONDS,
    HOST_PAUSES, ENERGY, ENERGY_IDLE,
    KV_BLOCKS, KV_USAGE,
    KV_EVENTS, KV_AGE, KV_RECOMPUTED_TOKENS, KV_TRACKING_DROPPED, PREFIX_QUERIED, PREFIX_HIT, PREFIX_REQUESTS, PREFIX_HIT_REQUESTS,
    EXPERT_TOKENS, HOT_EXPERT_TOKENS, MOE_IMBALANCE, SPEC_DRAFT, SPEC_ACCEPTED, SPEC_VERIFICATIONS,
    SPEC_POSITION_PROPOSED, SPEC_POSITION_ACCEPTED, SPEC_PREDICTED_SPEEDUP, SPEC_ACCEPT_RATE, PROBE_EVENTS,
    PROBE_DROPPED, PROBE_CORRUPT, PROBE_REJECTED, PROBE_LOST, REQUESTS_ORPHANED,
)
