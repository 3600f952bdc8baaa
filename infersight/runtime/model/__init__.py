"""The model: its shapes (model_config, torch-free), the decoder-only transformer over a paged KV
cache and its parts (layers, attention, moe, moe_experts), the weights that build it, what one
forward computes (forward_batch), and its GPU paths (forward_fused and the triton_* kernels).

Empty on purpose: the agent reads model_config without importing torch through here.
"""
