"""The flight recorder: sampled kernel windows inside an overhead budget (opt-in: --flight-recorder).

flight_recorder.py  FlightRecorder: opens windows, charges their cost, keeps their summaries
config.py           RecorderConfig, its one config object
budget.py           the overhead budget and a window's measured cost
triggers.py         the rules that take one full capture (SLO breach, step-time jump, preemptions)
window.py           a finished window's trace read into its kernel summary
vllm_windows.py     the same windows on a real vLLM, through its profiler endpoints
store.py            the kept window summaries
view.py             what the recorder shows: counters, gauges, the summary block

May import: infersight.agent (capture, state), correlate, kernels, exporters.catalogue and
exporters.aggregates, sources.vllm.trace. Outside the agent only the CLI (commands.agent, through
RecorderConfig's flag group) imports it.
"""
