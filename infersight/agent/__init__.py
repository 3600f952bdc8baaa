"""The sidecar: attaches to probe rings, aggregates, serves Prometheus and a JSON API."""
