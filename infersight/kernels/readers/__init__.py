"""Capture files -> KernelTrace frames: Kineto, Nsight Systems, Nsight Compute, a capture's shapes
file, and the bounded reading of a file from outside (input_files). Empty on purpose: importing one
reader does not import the others (or pandas) through here."""
