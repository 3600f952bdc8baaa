"""Engine-specific sources: each turns what one engine publishes into what the agent consumes for
every engine alike (`correlate.frames.EventFrames`, the catalogue's metrics); the agent, `correlate`
and the exporters never know which engine a record came from.

They run INSIDE the agent's process, built by the agent (they never import it). The vLLM code that
runs inside vLLM itself -- the plugin that writes probe records into a ring -- is `infersight.vllm`;
these read what vLLM publishes outside itself, with no plugin needed. docs/architecture.md, section 2.

vLLM's KV cache events over ZeroMQ -> the `kv_events` frame (`--vllm-kv-events`):
    vllm.kv_wire       the wire format, decoded with bounds
    vllm.kv_sequence   sequence numbers: order, gaps and replay, publisher restarts
    vllm.kv_blocks     prefix-cache events as KV block transitions, synthetic block ids
    vllm.kv_events     the subscriber the agent polls (sockets, counts, one-line logs)
    vllm.kv_metrics    its counts as Prometheus families (catalogue.VLLM_KV_METRICS)
    vllm.kv_remembered the ledger's table of remembered block ids, sized in bytes
    vllm.kv_config     VllmKvConfig: the agent's --vllm-kv-* flag group

An unmodified vLLM server's HTTP side (`--vllm-url`):
    vllm.scraper       scrapes its /metrics on a thread; vllm.metrics normalises them to our names
    vllm.profiler      captures through its /start_profile and /stop_profile; vllm.trace reads the trace
    vllm.http_config   VllmHttpConfig: the agent's --vllm-url flag group

capture_target: the contract of a capture the agent hands to a source (CaptureTarget and its outcomes).
"""
