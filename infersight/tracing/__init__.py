"""Traces built in the sidecar from probe events, after the fact, exported over OTLP.

config.py    TracingConfig, the part's one config object
semconv.py   attribute names and values (OpenTelemetry GenAI, OpenInference, Langfuse, infersight.*)
sampling.py  which requests are kept (head ratio, parent decision, always slow and failed)
spans.py     pure: a request's row and events -> span descriptions (no SDK objects)
exporter.py  the OpenTelemetry SDK plumbing: tracer provider, span descriptions -> SDK spans, OTLP
export_queue.py  the bounded export queue (spans and bytes), counted drops, shutdown with a deadline
bounded.py   tables bounded in entries and bytes, with counted evictions (the buffers below use them)
metrics.py   opt-in OTLP metrics: gen_ai.server.* histograms with the advised buckets
buffers.py   what the hook keeps between probe batches (steps, batch membership, served requests)
hook.py      the agent's hook: probe batches and finished rows in, spans out
"""
