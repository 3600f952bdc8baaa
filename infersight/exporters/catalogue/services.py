"""Metrics of the services around the engine, not in CATALOGUE: each is rendered by its own
collector: tracing and OTLP export, `infersight serve`, the OTLP receiver, vLLM's KV events, and
scraped engine sources."""
from __future__ import annotations

from infersight.exporters.catalogue.spec import MetricSpec, ratio, P

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
SERVER_DRAFT_FALLBACKS = MetricSpec(P + "server_draft_fallbacks", "counter",
                                    "Speculative decoding given up because the draft model failed, by scope: request "
                                    "(its draft sampling raised; it decodes without drafts from then on, its tokens "
                                    "still the target's) or step (the draft forward raised; that step ran plainly).",
                                    ("scope",))
HTTP_CONNECTIONS_REFUSED = MetricSpec(P + "http_connections_refused", "counter",
                                      "Connections refused (503, closed) because the HTTP server already held "
                                      "--max-connections, by server (serve, agent, otlp_receiver).", ("server",))
HTTP_CONNECTIONS_OPEN = MetricSpec(P + "http_connections_open", "gauge",
                                   "Connections the HTTP server holds now, refused ones not included, by server.",
                                   ("server",))
PROBE_RINGS_HELD = MetricSpec(P + "probe_rings_held_elsewhere", "gauge",
                              "Discovered probe rings this agent does not read because another live agent holds "
                              "their reader lease (a ring has one reader).")
PROBE_RING_ATTACH_SKIPPED = MetricSpec(P + "probe_ring_attach_skipped", "counter",
                                       "Times discovery found a ring held by another agent and passed it over "
                                       "(each held ring is checked again every retry interval; logged once).")
PROBE_RINGS_DEAD = MetricSpec(P + "probe_rings_dead", "counter",
                              "Probe rings whose writer died without closing them while this agent read them: "
                              "its pid exited (same pid namespace) or, from another pid namespace (a pod's "
                              "engine container), its heartbeat stopped for 5 beats. Each was drained, detached "
                              "and removed; a restarted engine writes a new ring.")
AGENT_POLL_FAILURES = MetricSpec(P + "agent_poll_failures", "counter",
                                 "Steps of the agent's poll that raised, by source (gpu, rings, tracing, "
                                 "vllm_kv_events, captures, parquet): that source's step was given up for that "
                                 "poll and the agent went on; the first of each kind is logged with its traceback.",
                                 ("source",))
AGENT_POLL_DURATION = MetricSpec(P + "agent_poll_duration_seconds", "histogram",
                                 "Wall-clock time of one agent poll (every source read and folded once): the "
                                 "agent's own cost per poll; a poll that grows under constant load is falling behind.",
                                 (), "seconds", buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                         1.0, 2.5, 5.0))
#: Served by the agent beside CATALOGUE, each by its own collector (http.connections, exporters.discovery,
#: agent.poll_guard, agent.poll_timer).
AGENT_SERVICE_METRICS: tuple[MetricSpec, ...] = (HTTP_CONNECTIONS_REFUSED, HTTP_CONNECTIONS_OPEN, PROBE_RINGS_HELD,
                                                 PROBE_RING_ATTACH_SKIPPED, PROBE_RINGS_DEAD, AGENT_POLL_FAILURES,
                                                 AGENT_POLL_DURATION)

TRACING_METRICS: tuple[MetricSpec, ...] = (OTLP_SPANS_EXPORTED, OTLP_SPANS_DROPPED, TRACING_BUFFER_EVICTED)
SERVE_METRICS: tuple[MetricSpec, ...] = (SERVER_TRACEPARENT_INVALID, SERVER_REJECTED, SERVER_REQUESTS_FAILED,
                                         SERVER_PROBE_WRITES_FAILED, SERVER_DRAFT_FALLBACKS, HTTP_CONNECTIONS_REFUSED,
                                         HTTP_CONNECTIONS_OPEN)

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
                                           "(did not parse), too_large, unsupported_media_type, too_many_connections "
                                           "(refused at --max-connections, 503).",
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

# -- vLLM's KV cache events (infersight.sources.vllm.kv_events), served by the agent when it runs with
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
                          views={"lost_ratio": ratio(P + "vllm_kv_lost_total", P + "vllm_kv_batches_total")})
VLLM_KV_MALFORMED = MetricSpec(P + "vllm_kv_malformed", "counter",
                               "vLLM KV event messages (or events in them) dropped, by reason (frame_count, topic, "
                               "sequence, too_large, payload, unknown_event, event_fields).", ("reason",))
VLLM_KV_RESTARTS = MetricSpec(P + "vllm_kv_publisher_restarts", "counter",
                              "Restarts of vLLM's KV event publisher (its sequence numbers began again).")
VLLM_KV_CACHED = MetricSpec(P + "vllm_kv_cached_blocks", "gauge",
                            "Blocks in vLLM's prefix cache now, as its KV events tell it.")
VLLM_KV_LEDGER_DROPPED = MetricSpec(P + "vllm_kv_ledger_dropped", "counter",
                                    "vLLM KV blocks the agent's ledger let go at its bounds, by reason: copies (a "
                                    "BlockStored past the live copies one hash may have: no cached row), "
                                    "forgotten_cached (cached copies of a hash forgotten at the remembered-blocks "
                                    "bound: no longer in vllm_kv_cached_blocks), forgotten (hashes forgotten at "
                                    "that bound, --vllm-kv-remember-mib).", ("reason",))
VLLM_KV_METRICS: tuple[MetricSpec, ...] = (VLLM_KV_EVENTS, VLLM_KV_BATCHES, VLLM_KV_GAPS, VLLM_KV_REPLAYED,
                                           VLLM_KV_LOST, VLLM_KV_MALFORMED, VLLM_KV_RESTARTS, VLLM_KV_CACHED,
                                           VLLM_KV_LEDGER_DROPPED)

# -- An engine's own /metrics scraped by the agent (infersight.sources.vllm.metrics, --vllm-url) and its
# profiler endpoints driven for captures (infersight.sources.vllm.profiler). The scraped values are served
# under the catalogue's names above (exporters.scraped_view); these count the source itself. Not in
# CATALOGUE: the source's collectors render them (as TRACING_METRICS).
SOURCE_SCRAPES = MetricSpec(P + "source_scrapes", "counter", "Scrapes of an engine's metrics endpoint, by source.",
                            ("source",))
SOURCE_SCRAPE_ERRORS = MetricSpec(P + "source_scrape_errors", "counter",
                                  "Failed scrapes of an engine's metrics endpoint, by source and reason (unreachable, "
                                  "timeout, http_status, unparsable, no_engine_metrics).", ("source", "reason"),
                                  views={"error_ratio": ratio(P + "source_scrape_errors_total",
                                                               P + "source_scrapes_total")})
CAPTURE_FAILURES = MetricSpec(P + "capture_failures", "counter",
                              "Captures that gave no analysable trace, by reason (profiler_http: the engine refused "
                              "or did not answer; no_trace: no trace appeared in the profiler directory in time; "
                              "unreadable: the trace did not parse).", ("reason",))
SOURCE_METRICS: tuple[MetricSpec, ...] = (SOURCE_SCRAPES, SOURCE_SCRAPE_ERRORS, CAPTURE_FAILURES)
