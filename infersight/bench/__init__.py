"""Benchmarks run from the CLI (`infersight bench ...`); they measure, they do not assert."""
