"""Speculative decoding: exact verification of a draft's tokens and the fallback when the draft fails
(verify), the draft model's turn in a step (draft_proposer), and the plain probe steps (spec_probe).

Empty on purpose: importing a submodule does not import the others through here.
"""
