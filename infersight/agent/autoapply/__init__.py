"""The closed loop (`infersight agent --auto-apply speculation | max-num-seqs`): advice applied to our
engine through its control block behind a canary, kept only when the measured A/B confirms it, rolled
back otherwise; every decision recorded (GET /api/v1/decisions, /metrics, span events, the report, MCP).
On vLLM, which cannot change at run time, the same advice as flags (vllm_flags)."""
