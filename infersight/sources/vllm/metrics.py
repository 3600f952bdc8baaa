"""vLLM's own /metrics, scraped by the agent and served under the catalogue's names (`--vllm-url`).

With nothing of ours installed in vLLM this is all the agent can see, and it is enough for the
dashboards' request, token, cache and speculation panels. The mapping (vLLM 0.32's
PrometheusStatLogger family -> catalogue metric; samples are matched by name, so the text reads the
same with or without its # TYPE lines):

    vllm:num_requests_running / _waiting      requests_running / requests_waiting (gauges)
    vllm:kv_cache_usage_perc (0..1)           kv_cache_usage_ratio
    vllm:request_success{finished_reason}     requests{task, finish_reason}
    vllm:prompt_tokens / generation_tokens    prompt_tokens / generation_tokens {task}
    vllm:num_preemptions                      preemptions{reason="recompute"} (v1 always recomputes)
    vllm:prefix_cache_queries / _hits         prefix_cache_queried_tokens / _hit_tokens {task}
    vllm:spec_decode_num_drafts               spec_verifications{task}
    vllm:spec_decode_num_draft_tokens         spec_draft_tokens{task}
    vllm:spec_decode_num_accepted_tokens      spec_accepted_tokens{task}
    vllm:spec_decode_num_accepted_tokens_per_pos{position}   spec_position_accepted{task, position}
    vllm:iteration_tokens_total (its _count)  steps (one observation per engine step with outputs)
    vllm:time_to_first_token_seconds          time_to_first_token_seconds{task}
    vllm:inter_token_latency_seconds          inter_token_latency_seconds{task}
    vllm:e2e_request_latency_seconds          e2e_request_latency_seconds{task}
    vllm:request_queue_time_seconds           request_phase_seconds{phase="queue", task}
    vllm:request_prefill_time_seconds         request_phase_seconds{phase="prefill", task}
    vllm:request_decode_time_seconds          request_phase_seconds{phase="decode", task}
    vllm:kv_block_lifetime_seconds            kv_block_age_seconds{kind="lifetime"}   (--kv-cache-metrics;
    vllm:kv_block_idle_before_evict_seconds   kv_block_age_seconds{kind="idle_before_evict"}   vLLM samples
    vllm:kv_block_reuse_gap_seconds           kv_block_age_seconds{kind="reuse_gap"}           the blocks)

Labels: vLLM's `model_name` and `engine` are not labels of these catalogue metrics, so series are
summed over them (several engines of one server are its data-parallel ranks); KV usage is averaged
over engines instead (each has its own pool). vLLM knows no task: task is "other", as for our own
engine's unlabelled requests. Finish reasons outside vLLM's enum become "other". Not mapped, because
vLLM does not have them: per-position proposed drafts (so the acceptance-by-position panel stays
empty), swapped requests, preemption stall and network phases, KV block states and transitions
(the KV events source gives those), expert load. vLLM's decode phase includes any preemption stall.
Histograms keep vLLM's bucket bounds (see exporters.scraped_view for why that keeps PromQL right).
The scraping itself (HTTP, failures, the thread) is in scraper.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from infersight.exporters import catalogue as C
from infersight.exporters.catalogue import MetricSpec
from infersight.exporters.exposition_parse import metric_families
from infersight.exporters.scraped_view import Labels, ScrapedHistogram, ScrapedView
from infersight.probes.config import TaskLabels

TASK = TaskLabels.OTHER
FINISH_REASONS = frozenset({"stop", "length", "abort", "error", "repetition"})  # vLLM's FinishReason


@dataclass(frozen=True)
class FamilyMap:
    """One vLLM family -> one catalogue metric. labels: our label values from one vLLM series' labels
    (in the spec's label order); combine: how series that land on the same labels add up."""

    spec: MetricSpec
    labels: Callable[[dict[str, str]], Labels]
    combine: str = "sum"  # sum | mean


def _task(_: dict[str, str]) -> Labels:
    return (TASK,)


def _fixed(*values: str) -> Callable[[dict[str, str]], Labels]:
    return lambda _: values


def _finish(labels: dict[str, str]) -> Labels:
    reason = labels.get("finished_reason", "")
    return TASK, reason if reason in FINISH_REASONS else TaskLabels.OTHER


def _position(labels: dict[str, str]) -> Labels:
    return TASK, labels.get("position", "")


#: Keyed by sample name: counters with their _total, histograms by their base name. Matching samples
#: (not parser families) reads the text the same with or without its # TYPE lines.
FAMILIES: dict[str, FamilyMap] = {
    "vllm:num_requests_running": FamilyMap(C.REQUESTS_RUNNING, _fixed()),
    "vllm:num_requests_waiting": FamilyMap(C.REQUESTS_WAITING, _fixed()),
    "vllm:kv_cache_usage_perc": FamilyMap(C.KV_USAGE, _fixed(), "mean"),
    "vllm:request_success_total": FamilyMap(C.REQUESTS, _finish),
    "vllm:prompt_tokens_total": FamilyMap(C.PROMPT_TOKENS, _task),
    "vllm:generation_tokens_total": FamilyMap(C.GENERATION_TOKENS, _task),
    "vllm:num_preemptions_total": FamilyMap(C.PREEMPTIONS, _fixed("recompute")),
    "vllm:prefix_cache_queries_total": FamilyMap(C.PREFIX_QUERIED, _task),
    "vllm:prefix_cache_hits_total": FamilyMap(C.PREFIX_HIT, _task),
    "vllm:spec_decode_num_drafts_total": FamilyMap(C.SPEC_VERIFICATIONS, _task),
    "vllm:spec_decode_num_draft_tokens_total": FamilyMap(C.SPEC_DRAFT, _task),
    "vllm:spec_decode_num_accepted_tokens_total": FamilyMap(C.SPEC_ACCEPTED, _task),
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": FamilyMap(C.SPEC_POSITION_ACCEPTED, _position),
    "vllm:iteration_tokens_total": FamilyMap(C.STEPS, _fixed()),  # a histogram: its count is served
    "vllm:time_to_first_token_seconds": FamilyMap(C.TTFT, _task),
    "vllm:inter_token_latency_seconds": FamilyMap(C.ITL, _task),
    "vllm:e2e_request_latency_seconds": FamilyMap(C.E2E, _task),
    "vllm:request_queue_time_seconds": FamilyMap(C.PHASE, _fixed("queue", TASK)),
    "vllm:request_prefill_time_seconds": FamilyMap(C.PHASE, _fixed("prefill", TASK)),
    "vllm:request_decode_time_seconds": FamilyMap(C.PHASE, _fixed("decode", TASK)),
    "vllm:kv_block_lifetime_seconds": FamilyMap(C.KV_AGE, _fixed("lifetime")),
    "vllm:kv_block_idle_before_evict_seconds": FamilyMap(C.KV_AGE, _fixed("idle_before_evict")),
    "vllm:kv_block_reuse_gap_seconds": FamilyMap(C.KV_AGE, _fixed("reuse_gap")),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _histograms(samples: list[Sample]) -> dict[tuple[tuple[str, str], ...], ScrapedHistogram]:
    """One histogram's samples (_bucket, _sum, _count) -> its series, by their labels without le."""
    parts: dict[tuple[tuple[str, str], ...], tuple[dict[float, float], list[float]]] = {}
    for s in samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        buckets, total = parts.setdefault(key, ({}, [0.0]))
        if s.name.endswith("_bucket") and "le" in s.labels:
            buckets[float(s.labels["le"])] = s.value
        elif s.name.endswith("_sum"):
            total[0] = s.value
    out = {}
    for key, (buckets, total) in parts.items():
        if float("inf") not in buckets:
            continue  # without its +Inf bucket a histogram has no count: nothing we can serve
        bounds = tuple(sorted(b for b in buckets if b != float("inf")))
        out[key] = ScrapedHistogram(bounds, tuple(buckets[b] for b in bounds) + (buckets[float("inf")],), total[0])
    return out


def _add_histogram(into: dict[Labels, ScrapedHistogram], key: Labels, h: ScrapedHistogram) -> None:
    have = into.get(key)
    if have is None:
        into[key] = h
    elif have.bounds == h.bounds:  # engines of one server share their bucket config
        into[key] = ScrapedHistogram(h.bounds, tuple(a + b for a, b in zip(have.cumulative, h.cumulative)),
                                     have.sum + h.sum)


def _histogram_base(name: str) -> str | None:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in FAMILIES:
            return name[: -len(suffix)]
    return None


def _float_samples(families: Iterable[Metric]) -> Iterator[Sample]:
    """Every sample with a float value. The parser keeps integral text as a Python int, and one that
    no float can hold (400 digits) is a ValueError here, not an OverflowError in a sum further on."""
    for family in families:
        for s in family.samples:
            try:
                yield s._replace(value=float(s.value))
            except OverflowError:
                raise ValueError(f"{s.name}: sample value of {len(str(s.value))} digits, too large for a float") from None


def normalise(families: Iterable[Metric]) -> ScrapedView:
    """The catalogue view of parsed vLLM families (samples of other families are ignored)."""
    view = ScrapedView()
    hist_samples: dict[str, list[Sample]] = {}
    means: dict[tuple[str, Labels], list[float]] = {}
    for s in _float_samples(families):
        base = _histogram_base(s.name)
        if base is not None:
            hist_samples.setdefault(base, []).append(s)
            continue
        fmap = FAMILIES.get(s.name)
        if fmap is None or fmap.spec.kind == "histogram":
            continue
        name, key = fmap.spec.name, fmap.labels(s.labels)
        if fmap.combine == "mean":
            means.setdefault((name, key), []).append(s.value)
        else:
            values = view.values.setdefault(name, {})
            values[key] = values.get(key, 0.0) + s.value
    for (name, key), xs in means.items():
        view.values.setdefault(name, {})[key] = sum(xs) / len(xs)
    for base, samples in hist_samples.items():
        fmap = FAMILIES[base]
        series = _histograms(samples)
        if fmap.spec is C.STEPS:  # vLLM observes tokens once per engine step: the count is the steps
            view.steps = sum(h.count for h in series.values())
            view.values[C.STEPS.name] = {(): view.steps}
            continue
        if fmap.spec.kind != "histogram":
            continue
        into = view.histograms.setdefault(fmap.spec.name, {})
        for labels, h in series.items():
            _add_histogram(into, fmap.labels(dict(labels)), h)
    return view


def parse_vllm_text(text: str) -> ScrapedView:
    """Exposition text -> the view; ValueError when it is not Prometheus text or has no vllm:* family."""
    families = list(metric_families(text))  # ValueError, one clear line, at the first bad line
    if not any(f.name.startswith("vllm:") for f in families):
        raise ValueError("no vllm:* families (is this vLLM's /metrics?)")
    return normalise(families)
