"""The vLLM tests' own reading of Prometheus text: a deliberately naive parser (expected values come
from here, never from the code under test, which uses prometheus_client's), the mapping the agent's
normalised view must follow (assert_view_matches), and a loopback server for canned /metrics text."""
from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Sample = tuple[str, frozenset[tuple[str, str]]]


def read_samples(text: str) -> dict[Sample, float]:
    """(sample name, labels) -> value, for every sample line."""
    out: dict[Sample, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None or line.startswith("#"):
            continue
        out[(m.group(1), frozenset(_LABEL.findall(m.group(2) or "")))] = float(m.group(3))
    return out


def total(samples: dict[Sample, float], name: str, **labels: str) -> float:
    """The sum of a sample name's values over the series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


def values(samples: dict[Sample, float], name: str, label: str, **labels: str) -> dict[str, float]:
    """{value of `label`: summed value} over a sample name's series matching `labels`."""
    out: dict[str, float] = {}
    want = set(labels.items())
    for (n, lab), v in samples.items():
        if n == name and want <= lab:
            key = dict(lab).get(label, "")
            out[key] = out.get(key, 0.0) + v
    return out


#: Our counter sample <- vLLM's counter sample (task is "other": vLLM knows no task).
COUNTERS = {
    "infersight_prompt_tokens_total": "vllm:prompt_tokens_total",
    "infersight_generation_tokens_total": "vllm:generation_tokens_total",
    "infersight_prefix_cache_queried_tokens_total": "vllm:prefix_cache_queries_total",
    "infersight_prefix_cache_hit_tokens_total": "vllm:prefix_cache_hits_total",
}
#: Our histogram (with its fixed labels) <- vLLM's histogram.
HISTOGRAMS = {
    ("infersight_time_to_first_token_seconds", ()): "vllm:time_to_first_token_seconds",
    ("infersight_inter_token_latency_seconds", ()): "vllm:inter_token_latency_seconds",
    ("infersight_e2e_request_latency_seconds", ()): "vllm:e2e_request_latency_seconds",
    ("infersight_request_phase_seconds", (("phase", "queue"),)): "vllm:request_queue_time_seconds",
    ("infersight_request_phase_seconds", (("phase", "prefill"),)): "vllm:request_prefill_time_seconds",
    ("infersight_request_phase_seconds", (("phase", "decode"),)): "vllm:request_decode_time_seconds",
}


def assert_view_matches(ours: dict, vllm: dict) -> None:
    """Every mapped series of the agent's /metrics is there and equals vLLM's, summed over vLLM's engines."""
    pairs = {**COUNTERS, "infersight_requests_total": "vllm:request_success_total",
             "infersight_preemptions_total": "vllm:num_preemptions_total",
             "infersight_steps_total": "vllm:iteration_tokens_total_count",
             "infersight_requests_running": "vllm:num_requests_running",
             "infersight_requests_waiting": "vllm:num_requests_waiting",
             "infersight_kv_cache_usage_ratio": "vllm:kv_cache_usage_perc",
             **{mine + "_bucket": theirs + "_bucket" for (mine, _), theirs in HISTOGRAMS.items()}}
    ours_names, theirs_names = {n for n, _ in ours}, {n for n, _ in vllm}
    missing = {m for m, t in pairs.items() if t in theirs_names and m not in ours_names}
    assert not missing, missing  # (totals below would compare 0 with 0 for a missing series)
    for mine, theirs in COUNTERS.items():
        assert total(ours, mine, task="other") == total(vllm, theirs), mine
    assert values(ours, "infersight_requests_total", "finish_reason", task="other") == \
        values(vllm, "vllm:request_success_total", "finished_reason")
    assert total(ours, "infersight_preemptions_total", reason="recompute") == total(vllm, "vllm:num_preemptions_total")
    assert total(ours, "infersight_steps_total") == total(vllm, "vllm:iteration_tokens_total_count")
    assert total(ours, "infersight_requests_running") == total(vllm, "vllm:num_requests_running")
    assert total(ours, "infersight_requests_waiting") == total(vllm, "vllm:num_requests_waiting")
    usage = values(vllm, "vllm:kv_cache_usage_perc", "engine")
    assert total(ours, "infersight_kv_cache_usage_ratio") == pytest.approx(sum(usage.values()) / len(usage))
    for (mine, fixed), theirs in HISTOGRAMS.items():
        labels = dict(fixed, task="other")
        assert values(ours, mine + "_bucket", "le", **labels) == values(vllm, theirs + "_bucket", "le"), mine
        assert total(ours, mine + "_count", **labels) == total(vllm, theirs + "_count"), mine
        assert total(ours, mine + "_sum", **labels) == pytest.approx(total(vllm, theirs + "_sum")), mine


class TextServer:
    """A loopback HTTP server answering GET /metrics with `respond()`: (status, body, delay_s)."""

    def __init__(self, respond: Callable[[], tuple[int, str, float]]) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                import time

                status, body, delay = respond()
                time.sleep(delay)
                outer.hits += 1
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (the slow-server case)

            def log_message(self, *args: object) -> None:
                pass

        self.hits = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
