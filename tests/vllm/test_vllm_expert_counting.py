"""The expert-counting logic of the vLLM plugin, on CPU torch without vLLM: a hand-built router with
known logits, counted eagerly and under torch.compile, against a naive Python count; and the
publisher thread, read back from a real ring."""
from __future__ import annotations

from functools import partial
from typing import Iterator

import numpy as np
import pytest
import torch
from testkit import unique_ring

from infersight.probes.records import MOE_EXPERTS_PER_RECORD
from infersight.probes.records import RecordKind, record_dtype, record_registry
from infersight.probes.ring import RingConsumer, RingProducer
from infersight.vllm.expert_counting import COMPARE_MAX_EXPERTS, ExpertCounter, ExpertPublisher, MoeRecords
from infersight.vllm.experts import ExpertCountsConfig, ExpertLoadPlugin


class HandRouter:
    """vLLM's CPU softmax top-k rule (cpu_router._softmax_topk: top-k of the raw logits, then a
    softmax over the k chosen) and BaseRouter's callback, called with the chosen ids."""

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self.capture_fn = None

    def select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, ids = torch.topk(logits, k=self.top_k, dim=-1, sorted=False)
        ids = ids.to(torch.int32)
        if self.capture_fn is not None:
            self.capture_fn(ids)
        return torch.softmax(values, dim=-1), ids


class HandMoE(torch.nn.Module):
    """Layers whose logits are given, not computed: forward(logits [layers, tokens, experts])."""

    def __init__(self, n_layers: int, top_k: int) -> None:
        super().__init__()
        self.routers = [HandRouter(top_k) for _ in range(n_layers)]

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(logits.shape[1])
        for layer, router in enumerate(self.routers):
            weights, _ = router.select(logits[layer])
            out = out + weights.sum(-1)
        return out


def naive_counts(logits: list[list[list[float]]], top_k: int, n_experts: int) -> list[list[int]]:
    counts = [[0] * n_experts for _ in logits]
    for layer, tokens in enumerate(logits):
        for row in tokens:
            for expert in sorted(range(n_experts), key=lambda e: -row[e])[:top_k]:
                counts[layer][expert] += 1
    return counts


LOGITS = [  # 2 layers x 5 tokens x 4 experts, no ties
    [[0.1, 0.9, 0.3, -1.0], [2.0, -2.0, 1.5, 0.0], [0.0, 0.2, 0.4, 0.6], [-0.5, -0.1, -0.9, -0.3], [3.0, 2.9, 2.8, 2.7]],
    [[1.0, 0.0, 0.5, 0.25], [0.0, 1.0, 0.5, 0.25], [0.3, 0.1, 0.2, 0.4], [0.9, 0.8, 0.7, 0.6], [-3.0, 3.0, -2.0, 2.0]],
]


def _bind(model: HandMoE, counter: ExpertCounter) -> None:
    for row, router in enumerate(model.routers):
        router.capture_fn = partial(counter.count, row)


def test_counts_match_a_naive_count_exactly() -> None:
    model, counter = HandMoE(2, top_k=2), ExpertCounter([0, 1], 4)
    _bind(model, counter)
    model(torch.tensor(LOGITS))
    assert naive_counts(LOGITS, 2, 4) == [[2, 3, 3, 2], [3, 3, 2, 2]]
    assert counter.counts.tolist() == [[2, 3, 3, 2], [3, 3, 2, 2]]
    model(torch.tensor(LOGITS))  # cumulative
    assert counter.counts.tolist() == [[4, 6, 6, 4], [6, 6, 4, 4]]


@pytest.mark.parametrize("n_experts", [4, COMPARE_MAX_EXPERTS + 8])  # compare-and-sum, then index_add_
def test_padding_rows_routed_to_minus_one_are_not_counted(n_experts: int) -> None:
    """vLLM's routers route padding rows to expert -1 (VLLM_MOE_SKIP_PADDING): they count nothing,
    and index_add_ is not given an index it would raise on."""
    ids = [[1, 3], [-1, -1], [3, 0], [-1, -1]]  # tokens x top_k: rows 1 and 3 are padding
    counter = ExpertCounter([0], n_experts)
    counter.count(0, torch.tensor(ids))
    naive = [sum(1 for r in ids for e in r if e == x) for x in range(n_experts)]
    assert counter.counts[0].tolist() == naive
    assert sum(naive) == 4


# compare-and-sum (inductor on it runs in the live vLLM test; aot_eager here is quicker), then index_add_
@pytest.mark.parametrize(("n_experts", "backend"), [(8, "aot_eager"), (COMPARE_MAX_EXPERTS + 8, "inductor")])
def test_counts_are_the_same_under_torch_compile_fullgraph(n_experts: int, backend: str) -> None:
    """vLLM's CPU path traces the MoE layer with Dynamo (fullgraph): the count must trace and still count."""
    rng = np.random.default_rng(3)
    model, counter = HandMoE(3, top_k=2), ExpertCounter([0, 1, 2], n_experts)
    _bind(model, counter)
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=True)
    expected = np.zeros((3, n_experts), dtype=np.int64)
    for tokens in (5, 9, 3, 17):
        logits = rng.standard_normal((3, tokens, n_experts)).tolist()
        compiled(torch.tensor(logits))
        expected += np.array(naive_counts(logits, 2, n_experts))
    assert counter.counts.tolist() == expected.tolist()
    assert counter.counts.sum(dim=1).tolist() == [2 * (5 + 9 + 3 + 17)] * 3
    model(torch.tensor(rng.standard_normal((3, 4, n_experts)).tolist()))  # eager, same counter
    assert counter.counts.sum(dim=1).tolist() == [2 * (5 + 9 + 3 + 17 + 4)] * 3


def _read_moe(consumer: RingConsumer) -> np.ndarray:
    return consumer.read().get(int(RecordKind.MOE), np.zeros(0, dtype=record_dtype(RecordKind.MOE)))


@pytest.fixture
def ring() -> Iterator[tuple[RingProducer, RingConsumer]]:
    producer = RingProducer.create(unique_ring("experts"), 256, None, record_registry())
    consumer = RingConsumer.attach(producer.name, record_registry())
    yield producer, consumer
    consumer.close()
    producer.close()
    producer.unlink()


def test_publisher_writes_what_was_counted_since_the_last_publish(ring: tuple[RingProducer, RingConsumer]) -> None:
    producer, consumer = ring
    model, counter = HandMoE(2, top_k=2), ExpertCounter([3, 5], 4)
    _bind(model, counter)
    publisher = ExpertPublisher(counter, producer, interval_s=60)  # not started: publish() by hand
    model(torch.tensor(LOGITS))
    assert publisher.publish() == 2
    recs = _read_moe(consumer)
    assert recs["step_id"].tolist() == [1, 1] and recs["layer"].tolist() == [3, 5]
    assert recs["n_experts"].tolist() == [4, 4] and recs["counts"][:, :4].tolist() == [[2, 3, 3, 2], [3, 3, 2, 2]]
    assert publisher.publish() == 0 and len(_read_moe(consumer)) == 0  # nothing new: nothing written
    model(torch.tensor(LOGITS)[:, :2])  # two tokens
    publisher.stop()  # the thread never ran; stop still publishes the rest
    recs = _read_moe(consumer)
    assert recs["step_id"].tolist() == [2, 2] and recs["counts"][:, :4].tolist() == [[1, 1, 2, 0], [1, 1, 2, 0]]
    assert counter.counts.tolist() == [[3, 4, 5, 2], [4, 4, 4, 2]]  # cumulative: never reset


def test_publisher_thread_loses_nothing_while_the_model_counts(ring: tuple[RingProducer, RingConsumer]) -> None:
    """The thread snapshots while forwards add: each delta may be early, their sum is exact."""
    producer, consumer = ring
    model, counter = HandMoE(2, top_k=2), ExpertCounter([0, 1], 4)
    _bind(model, counter)
    publisher = ExpertPublisher(counter, producer, interval_s=0.001).start()
    rng = np.random.default_rng(5)
    expected = np.zeros((2, 4), dtype=np.int64)
    seen = np.zeros((2, 4), dtype=np.int64)
    for _ in range(200):
        logits = rng.standard_normal((2, 3, 4)).tolist()
        model(torch.tensor(logits))
        expected += np.array(naive_counts(logits, 2, 4))
        for rec in _read_moe(consumer):
            seen[rec["layer"]] += rec["counts"][:4]
    publisher.stop()
    for rec in _read_moe(consumer):
        seen[rec["layer"]] += rec["counts"][:4]
    assert seen.tolist() == expected.tolist()
    assert publisher.window > 1 and producer.stats()["dropped"] == 0


def test_publisher_thread_reports_its_first_error_and_stops() -> None:
    producer = RingProducer.create(unique_ring("experts-err"), 16, None, record_registry())
    producer.close()  # writing now fails
    producer.unlink()
    model, counter = HandMoE(2, top_k=2), ExpertCounter([0, 1], 4)
    _bind(model, counter)
    model(torch.tensor(LOGITS))
    errors: list[BaseException] = []
    publisher = ExpertPublisher(counter, producer, interval_s=0.001, on_error=errors.append).start()
    publisher._thread.join(timeout=5)
    assert not publisher._thread.is_alive() and len(errors) == 1


def test_moe_records_split_wide_layers_into_blocks_of_64_experts() -> None:
    per = MOE_EXPERTS_PER_RECORD
    counts = np.arange(2 * (per + 6), dtype=np.int64).reshape(2, per + 6)
    recs = MoeRecords([3, 5], per + 6).fill(11, counts)
    assert recs["step_id"].tolist() == [11] * 4
    assert recs["layer"].tolist() == [3, 3, 5, 5]
    assert recs["expert_offset"].tolist() == [0, per, 0, per]
    assert recs["n_experts"].tolist() == [per + 6] * 4
    assert recs["counts"][1][:6].tolist() == counts[0, per:].tolist()
    assert recs["counts"][1][6:].sum() == 0
    assert recs["counts"][2].tolist() == counts[1, :per].tolist()


def test_counter_rejects_an_empty_shape() -> None:
    with pytest.raises(ValueError):
        ExpertCounter([], 4)


def test_config_from_env() -> None:
    assert ExpertCountsConfig.from_env({}).enabled
    assert not ExpertCountsConfig.from_env({"INFERSIGHT_EXPERT_COUNTS": "0"}).enabled
    hooks_only = ExpertCountsConfig.from_env({"INFERSIGHT_EXPERT_COUNTS": "hooks"})
    assert hooks_only.enabled and not hooks_only.count
    assert ExpertCountsConfig.from_env({"INFERSIGHT_EXPERT_TIMING": "/tmp/t.json"}).timing_path == "/tmp/t.json"
    assert ExpertCountsConfig.from_env({"INFERSIGHT_EXPERT_PUBLISH_INTERVAL": "0.5"}).publish_interval_s == 0.5
    with pytest.raises(ValueError):
        ExpertCountsConfig(ring_capacity=1)
    with pytest.raises(ValueError):
        ExpertCountsConfig(publish_interval_s=0)


def test_a_model_without_vllm_moe_layers_gets_no_hooks() -> None:
    plugin = ExpertLoadPlugin(ExpertCountsConfig())
    plugin.install()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(4, 2)))
    finally:
        plugin._registration.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    model(torch.zeros(1, 4))
    assert plugin._counter is None and plugin._publisher is None
