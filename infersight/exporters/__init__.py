"""Exporters: Prometheus exposition (and, later, OTLP and Parquet), all reading one metric catalogue."""
