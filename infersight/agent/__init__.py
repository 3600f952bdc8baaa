"""The sidecar: attaches to probe rings, aggregates, serves Prometheus and a JSON API.

service.py    Agent: builds its parts once (component.py's protocol, parts.py) and runs the poll loop
config.py     AgentConfig: its own few settings and one config object per component, each validating
              itself and owning its CLI flag group (*_config.py here, exporters/, sources/, tracing/)
ingest.py     the rings: attach, read, screen (record_limits.py)
state.py      AgentState: the folds (folds/) run under one lock; what the API and /metrics read
folds/        one fold per stream (steps, KV, prefix, spec, experts, network, energy, the requests)
recorder/     the flight recorder: sampled kernel windows inside an overhead budget
capture.py    captures on demand or by rule; capture_analysis.py reads a finished one
server.py     the HTTP API (behind infersight.http's limits); report.py builds its JSON

May import: correlate, exporters, gpu, http, kernels, probes, runtime.observer, sources, tracing
(tests/package/test_import_graph.py: RULES). Nothing below imports the agent.
"""
