"""The engine: the step loop (engine), its async-scheduling component (async_steps), the scheduler,
a request's state and sampling parameters, the finished output, and the offline LLM API.

Empty on purpose: importing a submodule does not import the others (or torch) through here.
"""
