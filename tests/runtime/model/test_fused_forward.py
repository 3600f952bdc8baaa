"""The fused kernels and forward (runtime.model.triton_fused, runtime.model.forward_fused) against the
model's own torch modules: run by Triton's CPU interpreter without a GPU, compiled on one."""
from __future__ import annotations

import os

import pytest
import torch

from infersight.runtime.model.forward_batch import ForwardBatch
from infersight.runtime.model.layers import RMSNorm, RotaryEmbedding
from infersight.runtime.model.model_config import MODEL_CONFIGS

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported
pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]' brings it)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def fused():
    from infersight.runtime.model import triton_fused
    return triton_fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rmsnorm_is_the_residual_add_then_rmsnorm(fused, dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x, delta = (torch.randn(5, 96, generator=gen).to(DEVICE, dtype) for _ in range(2))
    norm = RMSNorm(96, 1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=gen) + 0.5)
        total, out = fused.add_rmsnorm(x, delta, norm.weight, norm.eps)
        if DEVICE == "cuda" or dtype == torch.float32:
            assert torch.equal(total, x + delta)  # one rounding of the sum, like the torch add
        else:  # the interpreter casts float32 to bf16 by truncation: within one bf16 step
            torch.testing.assert_close(total, x + delta, rtol=2 ** -7, atol=0)
        want = norm(x + delta)
        _, no_delta = fused.add_rmsnorm(x, None, norm.weight, norm.eps)
        want_no_delta = norm(x)
    tol = 1e-6 if dtype == torch.float32 else 2 ** -6  # bf16: two roundings, one step each
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    torch.testing.assert_close(no_delta, want_no_delta, rtol=tol, atol=tol)


def test_rope_kv_rotates_q_and_writes_k_v_at_their_slots_only(fused) -> None:
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, blocks, block_size = 4, 2, 16, 6, 4
    rope = RotaryEmbedding(dim, 64, 10000.0).to(DEVICE)
    qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, generator=gen).to(DEVICE)
    positions = torch.tensor([0, 9, 33], device=DEVICE)
    slots = torch.tensor([5, 17, 22], device=DEVICE)
    k_cache = torch.zeros(blocks, block_size, kv_heads, dim, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    q = fused.rope_kv(qkv, rope.cos, rope.sin, positions, slots, k_cache, v_cache, heads)
    q_ref, k_ref, v_ref = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    torch.testing.assert_close(q, rope(q_ref.view(3, heads, dim), positions), rtol=1e-6, atol=1e-6)
    k_flat, v_flat = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
    torch.testing.assert_close(k_flat[slots], rope(k_ref.reshape(3, kv_heads, dim), positions), rtol=1e-6, atol=1e-6)
    assert torch.equal(v_flat[slots], v_ref.reshape(3, kv_heads, dim))
    untouched = torch.ones(blocks * block_size, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert not k_flat[untouched].any() and not v_flat[untouched].any()


def test_silu_mul_is_silu_of_gate_times_up(fused) -> None:
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(3, 2 * 1500, generator=gen).to(DEVICE)  # 1500: two column blocks, a ragged tail
    gate, up = gate_up.chunk(2, -1)
    torch.testing.assert_close(fused.silu_mul(gate_up), torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_is_the_one_token_linear(bias: bool) -> None:
    from infersight.runtime.model.triton_gemv import gemv, gemv_silu_mul

    gen = torch.Generator().manual_seed(6)
    # 37 rows and 1500 columns: a ragged last row block and a ragged tail of K (BLOCK_K 1024)
    x, w = torch.randn(1, 1500, generator=gen), torch.randn(2 * 37, 1500, generator=gen)
    b = torch.randn(2 * 37, generator=gen) if bias else None
    want = x.double() @ w.double().t() + (b.double() if bias else 0)  # a float64 reference
    got = gemv(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE) if bias else None)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-4)
    gate, up = want.chunk(2, -1)
    got = gemv_silu_mul(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE) if bias else None)
    torch.testing.assert_close(got.cpu().double(), torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="one token"):
        gemv(torch.zeros(2, 1500, device=DEVICE), w.to(DEVICE))


def _decode_batch(lens: list[int], block_size: int, tokens: list[int]) -> tuple[ForwardBatch, int]:
    """Sequences at positions lens[i] (their KV already cached) with shuffled, disjoint pages."""
    need = [-(-(n + 1) // block_size) for n in lens]
    pages = torch.randperm(sum(need) + 2, generator=torch.Generator().manual_seed(4)).tolist()
    width = max(need)
    tables, slots, start = [], [], 0
    for n, k in zip(lens, need):
        table = pages[start:start + k]
        start += k
        tables.append(table + [0] * (width - k))
        slots.append(table[n // block_size] * block_size + n % block_size)

    def t(v):
        return torch.tensor(v, dtype=torch.long, device=DEVICE)

    index = t(list(range(len(lens))))
    return ForwardBatch(input_ids=t(tokens), positions=t(lens), slot_mapping=t(slots), segments=[],
                        decode_index=index, decode_block_tables=t(tables), decode_context_lens=t([n + 1 for n in lens]),
                        logits_index=index), sum(need) + 2


@pytest.mark.parametrize("model_name, lens", [("tiny-draft", [3, 10, 1]), ("tiny-moe", [3, 10, 1]),
                                              ("tiny-draft", [9])])  # one token: the gemv kernels
def test_fused_forward_matches_the_model_forward(model_name: str, lens: list[int]) -> None:
    from infersight.runtime.model.forward_fused import FusedForward
    from infersight.runtime.model.weights import build_model

    cfg = MODEL_CONFIGS[model_name]
    model = build_model(cfg, dtype=torch.float32, device=DEVICE, seed=0, decode_attention="triton")
    block_size = 4
    batch, n_pages = _decode_batch(lens, block_size, [7, 100, 42][:len(lens)])
    gen = torch.Generator().manual_seed(5)
    shape = (cfg.n_layers, n_pages, block_size, cfg.n_kv_heads, cfg.head_dim)
    k_caches = torch.randn(shape, generator=gen).to(DEVICE)
    v_caches = torch.randn(shape, generator=gen).to(DEVICE)
    k_ref, v_ref = k_caches.clone(), v_caches.clone()
    k_before, v_before = k_caches.clone(), v_caches.clone()
    counts_ref = torch.zeros(cfg.n_layers, max(cfg.n_experts, 1), dtype=torch.long, device=DEVICE)
    counts = counts_ref.clone()
    with torch.inference_mode():
        batch.expert_counts = counts_ref if cfg.is_moe else None
        want = model(batch, k_ref, v_ref)
        batch.expert_counts = counts if cfg.is_moe else None
        got = FusedForward(model).decode(batch, k_caches, v_caches)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_caches, k_ref, rtol=1e-5, atol=1e-5)  # this step's K/V, at the same slots
    torch.testing.assert_close(v_caches, v_ref, rtol=1e-5, atol=1e-5)
    written = torch.zeros(n_pages * block_size, dtype=torch.bool, device=DEVICE)
    written[batch.slot_mapping] = True
    for after, before in ((k_caches, k_before), (v_caches, v_before)):
        flat_after, flat_before = after.flatten(1, 2), before.flatten(1, 2)
        assert torch.equal(flat_after[:, ~written], flat_before[:, ~written])  # no other slot touched
        assert not torch.equal(flat_after[:, written], flat_before[:, written])
    assert torch.equal(counts, counts_ref)  # MoE: the same routing, counted on the device
    if cfg.is_moe:
        assert int(counts.sum()) == cfg.n_layers * len(lens) * cfg.top_k


def test_fused_forward_of_a_mixed_batch_matches_the_model_forward() -> None:
    # A prompt chunk (5 tokens from position 0, logits for its last) next to two decodes.
    from infersight.runtime.model.forward_batch import Segment
    from infersight.runtime.model.forward_fused import FusedForward
    from infersight.runtime.model.weights import build_model

    cfg = MODEL_CONFIGS["tiny-draft"]
    model = build_model(cfg, dtype=torch.float32, device=DEVICE, seed=0, decode_attention="triton")
    block_size, n_pages = 4, 12

    def t(v):
        return torch.tensor(v, dtype=torch.long, device=DEVICE)

    prompt_table = [7, 2]  # positions 0..4: slots 28..31, then 8
    batch = ForwardBatch(
        input_ids=t([3, 1, 4, 1, 5, 9, 2]), positions=t([0, 1, 2, 3, 4, 6, 2]),
        slot_mapping=t([28, 29, 30, 31, 8, 4 * 4 + 2, 10 * 4 + 2]),
        segments=[Segment(0, 5, 5, t(prompt_table))], decode_index=t([5, 6]),
        decode_block_tables=t([[0, 4], [10, 0]]), decode_context_lens=t([7, 3]), logits_index=t([4, 5, 6]))
    gen = torch.Generator().manual_seed(6)
    shape = (cfg.n_layers, n_pages, block_size, cfg.n_kv_heads, cfg.head_dim)
    k_caches, v_caches = torch.randn(shape, generator=gen).to(DEVICE), torch.randn(shape, generator=gen).to(DEVICE)
    k_ref, v_ref = k_caches.clone(), v_caches.clone()
    with torch.inference_mode():
        want = model(batch, k_ref, v_ref)
        got = FusedForward(model).forward(batch, k_caches, v_caches)
    assert got.shape == (3, cfg.vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_caches, k_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v_caches, v_ref, rtol=1e-5, atol=1e-5)
