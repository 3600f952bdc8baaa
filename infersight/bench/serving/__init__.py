"""`infersight bench serving`: what observing costs the client, from the client's side.

`run` interleaves arms in phases, `switchback_run` switches each arm on and off in blocks of one phase; both
start `serve` and the agents as a user would (`processes`), drive closed-loop HTTP clients (`clients`) and
read CPU from /proc (`process_cpu`). `report` and `switchback` are pure over the measured frames. May import
the agent bench's process helpers and the workload; never the engine's internals.
"""
