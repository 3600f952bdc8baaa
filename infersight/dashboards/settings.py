"""Defaults shared by the dashboard generator and its command line, kept in a module that imports
nothing, so `infersight --help` and every other command start without loading the Grafana SDK."""
from __future__ import annotations

#: uid of the provisioned Prometheus datasource every panel queries.
DEFAULT_DATASOURCE_UID = "infersight-prometheus"
#: Prometheus as Grafana's server reaches it.
DEFAULT_PROMETHEUS_URL = "http://127.0.0.1:9090"
#: Prometheus's scrape interval for the agent (Grafana sizes $__rate_interval from it).
DEFAULT_SCRAPE_INTERVAL = "5s"
