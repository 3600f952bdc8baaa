"""What vLLM publishes outside itself, read by the agent with no plugin (the sources package's
docstring lists the modules): its KV cache events over ZeroMQ (kv_*) and its HTTP side (scraper,
metrics, profiler, trace, http_config)."""
