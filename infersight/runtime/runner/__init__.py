"""Running a model on a batch: the model runner (feeds to a ForwardBatch, one forward), the decode
CUDA graphs with their static inputs and greedy tokens, and the timing of a forward.

Empty on purpose: importing a submodule does not import the others through here.
"""
