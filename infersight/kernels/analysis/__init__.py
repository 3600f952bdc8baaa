"""Pure analyses over a KernelTrace's frames: categories, attribution to steps and requests, the
timeline, the roofline, findings, and the report that gathers them (cpu_trace: the same for a trace
of CPU ops). Empty on purpose: importing one does not import the others through here."""
