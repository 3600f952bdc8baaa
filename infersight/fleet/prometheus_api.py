"""Instant queries against Prometheus' HTTP API (GET /api/v1/query), with the standard library's
urllib: the fleet view asks, Prometheus computes. Every failure is a PrometheusError whose message
is one line for people (unreachable, HTTP status, an error Prometheus returned, a body that is not
its API's)."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


class PrometheusError(RuntimeError):
    """A query that gave no answer; str() is one line naming the server and why."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and its value (NaN where Prometheus says NaN)."""

    labels: dict[str, str]
    value: float


class PrometheusAPI:
    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """The instant vector `expr` evaluates to at `at` (Unix seconds; None: Prometheus' now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        body = self._get("/api/v1/query", params)
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
            raise PrometheusError(f"{self.base_url}: unexpected answer to {expr[:60]!r}: not an instant vector")
        if data["resultType"] == "scalar":
            return [Sample({}, _number(data["result"][1]))]
        return [Sample(dict(r.get("metric", {})), _number(r["value"][1])) for r in data["result"]]

    def _get(self, path: str, params: dict[str, str]) -> dict:
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:  # noqa: S310 (http(s) only: FleetConfig)
                raw = resp.read()
        except urllib.error.HTTPError as exc:  # Prometheus answers 400/422 with a JSON error body
            raw = exc.read()
            reason = _api_error(raw) or f"HTTP {exc.code}"
            raise PrometheusError(f"{self.base_url}: {reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            why = getattr(exc, "reason", exc)
            raise PrometheusError(f"{self.base_url} is unreachable: {why}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{self.base_url} did not answer with Prometheus' JSON API "
                                  f"(is it a Prometheus URL?)") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"{self.base_url}: {_api_error(raw) or 'the query failed'}")
        return body


def _api_error(raw: bytes) -> str | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if isinstance(body, dict) and body.get("error"):
        return " ".join(f"{body.get('errorType', 'error')}: {body['error']}".split())[:300]
    return None


def _number(text: str) -> float:
    return float(text)  # Prometheus writes NaN, +Inf and -Inf so; float() reads them
