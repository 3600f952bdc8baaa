"""Slow requests: which finished requests are slow (the rule and its config) and why (the judge over
correlate.slow_rule and correlate.slow_causes)."""
