"""`infersight bench speculation`: the speedup speculation really gives, by the client's clock, against the
agent's prediction from its probe records.

`fixed_batch_ab` runs the same requests at a fixed batch through a plain and a speculative engine;
`arrivals_ab` does it on the demo's own arrivals (`arrival_run`). `fixed_batch` holds the engine feeding both
share. May import the runtime, the probes, the correlate analyses and the workload.
"""
