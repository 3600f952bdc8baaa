"""The folds AgentState runs under its lock, one stream each: what a poll's frames add to the
agent's counters, histograms and bounded windows.

step.py            steps and batch rows (engine time per request, step attribution)
kv.py              KV block events
prefix.py          prefix-cache lookups
spec.py            speculative-decoding verifications
expert.py          MoE routing and expert-parallel records
network_hold.py    served requests' NETWORK records (a row waits for its own)
energy_account.py  GPU energy measured per step
request_ledger.py  the requests themselves: a row is built once its events, network and energy are in

May import: correlate, exporters (catalogue, aggregates), gpu.samples and the agent's own leaf
modules (energy_meter, finished_rows, row_window, slow_judge, engine_scope); never agent.state or agent.service,
which run them.
"""
