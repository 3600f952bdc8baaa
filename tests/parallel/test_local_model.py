"""Each expert-parallel rank builds only the experts its placement gives it, with the weights the
single-process model has. Expected shares are written out here by hand (home shards of 8 experts)
or from the config's arithmetic, never from the placement code."""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from ep_workers import BIG_EXPERTS, build_peak_rss
from infersight.runtime.config import EngineConfig, ModelConfig
from infersight.runtime.errors import WeightsError
from infersight.runtime.parallel.group import EPGroup
from infersight.runtime.parallel.local_model import build_local_model
from infersight.runtime.parallel.placement import LayerPlacement
from infersight.runtime.parallel.stats import EPStatsCollector
from infersight.runtime.ranges import RangeMarker
from infersight.runtime.model.weights import build_model, save_safetensors

RANDOM = ModelConfig("ep-local-test", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                     n_experts=8, top_k=2, shared_expert=True, max_seq_len=64)
#: Home shards of 8 experts, by hand: rank r gets [floor(8r/W), floor(8(r+1)/W)).
HOME = {2: [(0, 1, 2, 3), (4, 5, 6, 7)], 3: [(0, 1), (2, 3, 4), (5, 6, 7)],
        4: [(0, 1), (2, 3), (4, 5), (6, 7)]}


def expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.d_model * cfg.ffn_dim  # gate_up [2F, d] + down [d, F], no biases


def _rank_model(config: EngineConfig, world: int, rank: int, placements=None):
    group = EPGroup(rank, world, "cpu")  # building needs no collective, so no process group here
    return build_local_model(config, group, EPStatsCollector(rank, world, "cpu"), RangeMarker(), placements)


def _local_expert_params(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".local_experts." in n)


def _assert_same_weights(model, full, slots_by_layer) -> None:
    """Every tensor of the rank's model equals the full model's, local slot j <-> expert slots[j]."""
    want = dict(full.named_parameters())
    for name, param in model.named_parameters():
        if ".local_experts." in name:
            head, rest = name.split(".ffn.local_experts.")
            slot, leaf = rest.split(".", 1)
            layer = int(head.split(".")[1])
            name = f"{head}.ffn.experts.{slots_by_layer[layer][int(slot)]}.{leaf}"
        assert torch.equal(param, want[name]), name


@pytest.mark.parametrize("model_name", ["random", "tiny-moe"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_holds_exactly_its_home_share(model_name, world):
    cfg = RANDOM if model_name == "random" else None
    config = EngineConfig(model=cfg or model_name, device="cpu", dtype="float32", seed=5)
    cfg = config.model_config
    full = build_model(cfg, dtype=torch.float32, device="cpu", seed=5)  # shipped weights for tiny-moe
    full_bytes = sum(p.numel() * 4 for p in full.parameters())
    per_expert = expert_params(cfg)
    total = 0
    for rank, home in enumerate(HOME[world]):
        model = _rank_model(config, world, rank)
        assert all(p.device.type == "cpu" for p in model.parameters())  # nothing left on meta
        assert _local_expert_params(model) == cfg.n_layers * len(home) * per_expert
        not_held = cfg.n_layers * (cfg.n_experts - len(home)) * per_expert
        assert sum(p.numel() * p.element_size() for p in model.parameters()) == full_bytes - 4 * not_held
        _assert_same_weights(model, full, {i: home for i in range(cfg.n_layers)})
        total += _local_expert_params(model)
    assert total == cfg.n_layers * cfg.n_experts * per_expert


def test_replicas_add_their_copies_and_only_them():
    config = EngineConfig(model=RANDOM, device="cpu", dtype="float32", seed=5)
    full = build_model(RANDOM, dtype=torch.float32, device="cpu", seed=5)
    # layer 0: expert 0 copied to rank 2, expert 5 to rank 0; layer 1 keeps its home shards
    placements = {0: LayerPlacement.contiguous(8, 3).with_replicas([(0, 2), (5, 0)])}
    slots = {0: [(0, 1, 5), (2, 3, 4), (5, 6, 7, 0)], 1: HOME[3]}
    for rank in range(3):
        model = _rank_model(config, 3, rank, placements)
        held = len(slots[0][rank]) + len(slots[1][rank])
        assert _local_expert_params(model) == held * expert_params(RANDOM)
        _assert_same_weights(model, full, {layer: slots[layer][rank] for layer in slots})


def test_weights_file_is_checked_like_the_full_load(tmp_path):
    other = ModelConfig("ep-local-other", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=40,
                        n_experts=8, top_k=2, shared_expert=True, max_seq_len=64)
    path = tmp_path / "other.safetensors"
    save_safetensors(build_model(other, dtype=torch.float32, device="cpu", seed=0), path)
    config = EngineConfig(model=RANDOM, device="cpu", dtype="float32", weights=str(path))
    with pytest.raises(WeightsError, match="shape"):  # an expert this rank does not hold is checked too
        _rank_model(config, 2, 0)
    with pytest.raises(WeightsError, match="not found"):
        _rank_model(EngineConfig(model=RANDOM, device="cpu", weights=str(tmp_path / "none")), 2, 0)


def test_peak_memory_is_the_share_not_the_full_model():
    """The OS's own high-water mark (ru_maxrss) of a fresh process per build: a rank of W = 4
    never holds the full model on the way, only its quarter of the experts (+ one tensor's draws)."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        full_bytes, full_peak = pool.apply(build_peak_rss, (4, None))
        local_bytes, local_peak = pool.apply(build_peak_rss, (4, 1))
    expert_bytes = 4 * BIG_EXPERTS.n_layers * BIG_EXPERTS.n_experts * expert_params(BIG_EXPERTS)
    assert full_bytes - local_bytes == expert_bytes * 3 // 4
    assert full_peak >= 0.9 * full_bytes  # the control: the full build's pages are all touched
    largest = 4 * 2 * BIG_EXPERTS.ffn_dim * BIG_EXPERTS.d_model  # one gate_up tensor: the transient draws
    assert local_peak <= local_bytes + 2 * largest + (8 << 20), (local_peak, local_bytes, full_peak)
