"""The sync-free expert paths (grouped GEMM, padded batched matmul) against an independent
per-token loop, the device histogram against torch.bincount, and the stacked weights' views."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from infersight.runtime.model.model_config import ModelConfig
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.model.moe_experts import expert_histogram, grouped_mm_problem
from infersight.runtime.ranges import RangeMarker, layer_range_names

TINY = ModelConfig("t-moe", d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, n_experts=4, top_k=2,
                   shared_expert=True, max_seq_len=64)
PATHS = ["padded"] + (["grouped"] if grouped_mm_problem(torch.device("cpu"), torch.float32) is None else [])


def _per_token(moe: MoEFFN, x: torch.Tensor) -> torch.Tensor:
    rows = []
    for t in range(x.shape[0]):
        probs = torch.softmax(moe.router(x[t]).double(), -1)
        top = torch.topk(probs, moe.top_k)
        w = top.values / top.values.sum()
        y = sum(w[j] * moe.experts[int(top.indices[j])](x[t]).double() for j in range(moe.top_k))
        rows.append(y + (moe.shared(x[t]).double() if moe.shared is not None else 0))
    return torch.stack(rows)


def test_histogram_equals_bincount() -> None:
    ids = torch.randint(0, 7, (33, 3), generator=torch.Generator().manual_seed(1))
    assert expert_histogram(ids, 9).tolist() == torch.bincount(ids.flatten(), minlength=9).tolist()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("top_k,shared,tokens", [(2, True, 7), (3, False, 5), (1, False, 1)])
def test_sync_free_paths_equal_a_per_token_loop(path, top_k, shared, tokens) -> None:
    torch.manual_seed(top_k)
    cfg = dataclasses.replace(TINY, top_k=top_k, shared_expert=shared)
    moe = MoEFFN(cfg, RangeMarker(), layer_range_names(0)).eval()
    moe.expert_path = path
    x = torch.randn(tokens, cfg.d_model)
    counts = torch.zeros(cfg.n_experts, dtype=torch.long)
    with torch.no_grad():
        got = moe(x, counts)
        want = _per_token(moe, x)
    assert torch.allclose(got.double(), want, atol=1e-5)
    ids = torch.topk(moe.router(x), top_k, dim=-1).indices
    assert counts.tolist() == torch.bincount(ids.flatten(), minlength=cfg.n_experts).tolist()


@pytest.mark.parametrize("path", PATHS)
def test_top2_equals_the_loop_path(path) -> None:
    # Slot sums in slot order equal the loop's ascending-expert adds for top_k = 2; only the
    # matmul kernels differ, so the two paths agree to float32 rounding.
    torch.manual_seed(3)
    moe = MoEFFN(TINY, RangeMarker(), layer_range_names(0)).eval()
    x = torch.randn(9, TINY.d_model)
    with torch.no_grad():
        moe.expert_path = "loop"
        loop = moe(x)
        moe.expert_path = path
        other = moe(x)
    assert torch.allclose(loop, other, atol=1e-6)


def test_stacked_weights_are_the_parameters() -> None:
    torch.manual_seed(4)
    moe = MoEFFN(TINY, RangeMarker(), layer_range_names(0)).eval()
    names = sorted(moe.state_dict())
    moe.expert_path = "padded"
    x = torch.randn(3, TINY.d_model)
    with torch.no_grad():
        moe(x)
        gate_up, down = moe._stacked.get(moe.experts)
        assert sorted(moe.state_dict()) == names  # checkpoints keep per-expert names
        assert moe.experts[2].gate_up.weight.data_ptr() == gate_up[2].data_ptr()
        moe.experts[1].down.weight.mul_(2.0)  # a load writes through the view
        assert torch.equal(down[1], moe.experts[1].down.weight)
        moe.to(torch.float64)  # new parameters: stacked again, not stale
        after = moe(x.double())
    assert moe._stacked.gate_up.dtype == torch.float64
    assert torch.allclose(after, _per_token(moe, x.double()), atol=1e-10)


def test_path_choice_depends_on_shape_only() -> None:
    from infersight.runtime.model.moe import choose_path

    assert choose_path(32, 8, True) == "padded"      # batch 16, top-2: every expert is read anyway
    assert choose_path(2, 8, True) == "grouped"      # batch 1: read only the two routed experts
    assert choose_path(4096, 8, True) == "grouped"   # prefill: padded's 8x FLOPs would dominate
    assert choose_path(2, 8, False) == "padded"
    assert choose_path(4096, 8, False) == "loop"
    moe = MoEFFN(TINY, RangeMarker(), layer_range_names(0))
    assert moe._path(torch.zeros(1, TINY.d_model)) == "loop"  # CPU: the reference path, today's tokens
