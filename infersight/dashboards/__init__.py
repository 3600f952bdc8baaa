"""What people look at: Grafana dashboards generated from the metric catalogue (`grafana`), and the
self-contained HTML report drawn from a run's Parquet files (`report`)."""
