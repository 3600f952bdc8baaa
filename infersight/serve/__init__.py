"""`infersight serve`: an OpenAI-compatible HTTP server around the runtime, probes on.

config.py         ServeConfig (bind address, limits, content export)
protocol.py       the OpenAI wire format: validation, response and SSE chunk bodies
fields.py         typed readers of body fields (each names its field in its 400)
api_error.py      OpenAI-style errors (also the body of infersight.http.limits' refusals)
tracecontext.py   the caller's W3C traceparent/tracestate
engine_loop.py    the engine thread and the hand-off between it and the asyncio handlers
probe_records.py  the server's probe records (SERVED, REQUEST_TEXT; NETWORK via ProbeObserver)
app.py            the Starlette app
metrics.py        the server's counters on /metrics
sidecar.py        `--with-agent`: the agent as a subprocess
runner.py         wiring: engine + probes + engine thread + uvicorn (+ agent)
startup_heap.py   the start-up heap frozen out of the cyclic collector once warm
"""
