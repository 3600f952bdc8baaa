"""Captures on demand and by rule: the controller (POST /api/v1/capture, auto-capture rules, the
token), the analysis of a finished capture, and their config."""
