"""Engine-specific sources: each turns what one engine publishes into what the agent consumes for
every engine alike (`correlate.frames.EventFrames`, the catalogue's metrics); the agent, `correlate`
and the exporters never know which engine a record came from.

vLLM's KV cache events over ZeroMQ -> the `kv_events` frame (`--vllm-kv-events`):
    vllm_kv_wire       the wire format, decoded with bounds
    vllm_kv_sequence   sequence numbers: order, gaps and replay, publisher restarts
    vllm_kv_blocks     prefix-cache events as KV block transitions, synthetic block ids
    vllm_kv_events     the subscriber the agent polls (sockets, counts, one-line logs)
    vllm_kv_metrics    its counts as Prometheus families (catalogue.VLLM_KV_METRICS)
"""
