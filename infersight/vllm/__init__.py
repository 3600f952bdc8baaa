"""The vLLM plugin: runs INSIDE vLLM's processes (its API server and workers), loaded by vLLM's own
plugin points (the stat logger and general plugin entry points, the ASGI middleware), in vLLM's
environment. It does one thing, as our engine's observer does: write probe records into a ring
(`writer.py`, `translate.py`, `stat_logger.py`, `middleware.py`, `experts.py`, `expert_counting.py`).
It may import only the engine side (`probes`, `serve`, `workload`), never the agent, and loads none of
the agent's dependencies (pandas, prometheus_client, OpenTelemetry, ZeroMQ): it sits on vLLM's hot path.

What reads vLLM from OUTSIDE it -- its KV events, its /metrics, its profiler traces -- runs inside the
agent: `infersight.sources` (the vllm_* modules). Shared by both: `ids.py` (vLLM's request ids as ours).
Tools that never load inside a vLLM server: `launch.py`, `tiny_model.py`, `client_workload.py`.
docs/architecture.md, section 2, follows one vLLM step through both.
"""
