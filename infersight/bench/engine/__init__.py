"""The engine's own speed, in one process: `bench runtime` (prefill, decode, the decode block and the Hugging
Face anchor) and `bench overhead` (what the probes cost, through a switchable observer). May import the
runtime, the probes and the kernels' roofline; never the agent.
"""
