"""The KV cache: the device block pool with its prefix cache (kv_pool) and the per-request block
tables, slot allocation and CPU swap tier over it (kv_cache).

Empty on purpose: importing a submodule does not import the others through here.
"""
