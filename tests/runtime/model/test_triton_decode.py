"""The Triton paged decode kernel against naive_attention, run by Triton's CPU interpreter
(TRITON_INTERPRET=1), so CI checks the kernel's indexing and masking without a GPU. The H200 run
of the same kernel is benchmarks/gpu_check.py."""
from __future__ import annotations

import os

import pytest
import torch

from infersight.runtime.model.attention import gather_kv, naive_attention
from infersight.runtime.config import EngineConfig

if not torch.cuda.is_available():
    # Triton reads the flag when it is first imported; no other CPU test uses Triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]' brings it)")

REL_TOL = 1e-5


@pytest.fixture(scope="module")
def kernel():
    from infersight.runtime.model.triton_decode import triton_paged_decode_attention
    if not torch.cuda.is_available():
        return triton_paged_decode_attention

    def on_gpu(*args, **kwargs):  # the same CPU-built cases, run by the compiled kernel
        moved = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
        return triton_paged_decode_attention(*moved, **kwargs).cpu()
    return on_gpu


def _paged(gen: torch.Generator, lens: list[int], block_size: int, hkv: int, d: int, dtype=torch.float32):
    """Caches with shuffled page ids (spare pages in between), tables padded with page 0."""
    need = [-(-n // block_size) for n in lens]
    n_pages = 2 * sum(need) + 3
    k_cache = torch.randn(n_pages, block_size, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(n_pages, block_size, hkv, d, generator=gen).to(dtype)
    ids = torch.randperm(n_pages, generator=gen)
    tables = torch.zeros(len(lens), max(need), dtype=torch.int64)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[start:start + n]
        start += n
    return k_cache, v_cache, tables


def _reference(q, k_cache, v_cache, tables, lens, scale=None):
    rows = []
    for b, n in enumerate(lens):
        k, v = gather_kv(k_cache, v_cache, tables[b], n)
        rows.append(naive_attention(q[b:b + 1].double(), k.double(), v.double(), causal=False, scale=scale))
    return torch.cat(rows)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


# (block_size, kv heads, query heads per kv head, head_dim): powers of two and not, GQA and MHA.
SHAPES = [(16, 2, 4, 16), (4, 1, 1, 8), (16, 8, 4, 64), (3, 2, 3, 12)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blocks_per_split", [None, 1, 3])
def test_matches_naive(kernel, shape, blocks_per_split) -> None:
    block_size, hkv, group, d = shape
    gen = torch.Generator().manual_seed(block_size * 31 + d)
    lens = [15, 16, 17, 32, 1, 75]
    k_cache, v_cache, tables = _paged(gen, lens, block_size, hkv, d)
    q = torch.randn(len(lens), hkv * group, d, generator=gen)
    out = kernel(q, k_cache, v_cache, tables, torch.tensor(lens), blocks_per_split=blocks_per_split)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert _rel_err(out, _reference(q, k_cache, v_cache, tables, lens)) <= REL_TOL


def test_bfloat16_cache_accumulates_in_float32(kernel) -> None:
    gen = torch.Generator().manual_seed(5)
    lens = [40, 3]
    k_cache, v_cache, tables = _paged(gen, lens, 16, 2, 32, dtype=torch.bfloat16)
    q = torch.randn(2, 8, 32, generator=gen).to(torch.bfloat16)
    out = kernel(q, k_cache, v_cache, tables, torch.tensor(lens))
    assert out.dtype == torch.bfloat16
    # Float32 math on bf16 inputs, cast once to bf16 at the end: within one bf16 ulp (2^-7
    # relative; the interpreter truncates that cast where a GPU rounds to nearest).
    assert _rel_err(out, _reference(q, k_cache, v_cache, tables, lens)) <= 2 ** -7


def test_never_reads_padding_pages(kernel) -> None:
    # Page 0 pads the tables and holds huge values: reading any of it would swamp the output.
    gen = torch.Generator().manual_seed(8)
    lens = [5, 13]
    k_cache, v_cache, tables = _paged(gen, lens, 4, 1, 8)
    for b, n in enumerate(lens):
        used = -(-n // 4)
        tables[b, :used] = torch.where(tables[b, :used] == 0, 1, tables[b, :used])
    ref = _reference(torch.ones(2, 2, 8), k_cache, v_cache, tables, lens, scale=0.5)
    k_cache[0] = 1e4
    v_cache[0] = 1e4
    out = kernel(torch.ones(2, 2, 8), k_cache, v_cache, tables, torch.tensor(lens), scale=0.5, blocks_per_split=1)
    assert _rel_err(out, ref) <= REL_TOL


def test_heads_must_group(kernel) -> None:
    k_cache = torch.zeros(2, 4, 3, 8)
    with pytest.raises(ValueError, match="multiple"):
        kernel(torch.zeros(1, 4, 8), k_cache, k_cache, torch.zeros(1, 1, dtype=torch.int64), torch.ones(1))


def test_engine_config_resolves_decode_kernel() -> None:
    assert EngineConfig(device="cpu").resolved_decode_attention == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        EngineConfig(device="cpu", decode_attention="triton")
    with pytest.raises(ValueError, match="decode_attention"):
        EngineConfig(decode_attention="cuda-graphs")


@pytest.mark.parametrize("tuning", [dict(target_programs=1), dict(block_t=16), dict(block_t=32, target_programs=4096)])
def test_wide_padded_tables_and_tunings(kernel, tuning) -> None:
    # A CUDA graph's tables are padded far past every context: per-sequence splits still read only
    # the context, one split (target_programs=1) writes the output directly, and any tile size agrees.
    from infersight.runtime.model.triton_decode import DecodeTuning

    gen = torch.Generator().manual_seed(11)
    lens = [1, 70, 33]
    k_cache, v_cache, tables = _paged(gen, lens, 16, 2, 32)
    wide = torch.cat([tables, torch.zeros(3, 20, dtype=torch.int64)], dim=1)
    ref = _reference(torch.randn(3, 8, 32, generator=gen), k_cache, v_cache, tables, lens)
    gen = torch.Generator().manual_seed(11)
    _paged(gen, lens, 16, 2, 32)
    q = torch.randn(3, 8, 32, generator=gen)
    k_cache[0] = 1e4  # padding page: reading it would swamp the output
    v_cache[0] = 1e4
    used = [t for b, n in enumerate(lens) for t in tables[b, :-(-n // 16)].tolist()]
    assert 0 not in used
    out = kernel(q, k_cache, v_cache, wide, torch.tensor(lens), tuning=DecodeTuning(**tuning))
    assert _rel_err(out, ref) <= REL_TOL
