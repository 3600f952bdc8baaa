"""Attention kernels for the reference inference runtime.

Everything here is plain PyTorch so it runs on CPU and serves as a readable,
testable reference for what the runtime computes:

* ``naive_attention``: full softmax, the ground truth for tests.
* ``flash_attention``: tiled prefill attention with an online softmax.
* ``paged_decode_attention``: split-KV decode over a paged KV cache.

Shapes use a token-major layout, ``[tokens, heads, head_dim]``, because that is
how the KV cache stores them. Grouped-query attention maps query head ``h`` to
kv head ``h // (Hq // Hkv)``; we reshape queries to ``[.., Hkv, G, D]`` instead
of repeating K/V so the kv heads are never copied ``G`` times.

Online-softmax rule: two partial results ``(m1, l1, o1)`` and ``(m2, l2, o2)``
over disjoint key sets, where ``m`` is the max score, ``l = sum(exp(s - m))``
and ``o = sum(exp(s - m) * v)``, combine exactly as ``m = max(m1, m2)``,
``l = l1 * exp(m1 - m) + l2 * exp(m2 - m)`` and likewise for ``o``; the final
output is ``o / l``. Subtracting the running max keeps ``exp`` from overflowing.
"""

from __future__ import annotations

import math

import torch


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate [L, H, D] shapes and return the query-group size Hq // Hkv."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("q, k, v must be [tokens, heads, head_dim]")
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    hq, hkv = q.shape[1], k.shape[1]
    if q.shape[2] != k.shape[2]:
        raise ValueError("q and k head_dim differ")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return hq // hkv


def _finite_max(m: torch.Tensor) -> torch.Tensor:
    """Replace -inf maxima (rows with no visible key) by 0.

    Such rows would otherwise compute exp(-inf - -inf) = NaN; with a reference of
    0 their exps are exp(-inf) = 0, so they contribute nothing, as they should.
    """
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def _normalise(o: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """Return o / l, with rows that saw no key (l == 0) set to zero instead of NaN."""
    l = l.unsqueeze(-1)
    return torch.where(l > 0, o / l.clamp_min(torch.finfo(l.dtype).tiny), torch.zeros_like(o))


def merge_partials(m: torch.Tensor, l: torch.Tensor, o: torch.Tensor, dim: int) -> torch.Tensor:
    """Merge partial softmax results along ``dim`` and return the normalised output.

    ``m`` and ``l`` share a shape; ``o`` has that shape plus a trailing head_dim.
    ``dim`` is the split axis counted in ``m``'s dimensions (negative values are
    resolved against ``m``, not ``o``). Partials that saw no key carry
    ``m = -inf`` and ``l = 0`` and contribute nothing.
    """
    dim = dim % m.dim()
    m_all = _finite_max(m.amax(dim=dim, keepdim=True))
    # Rescale every split to the common max before summing (online-softmax rule).
    w = torch.exp(m - m_all)
    l_all = (w * l).sum(dim=dim)
    o_all = (w.unsqueeze(-1) * o).sum(dim=dim)
    return _normalise(o_all, l_all)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    q_offset: int = 0, scale: float | None = None) -> torch.Tensor:
    """Reference attention with a fully materialised score matrix.

    q [Lq, Hq, D]; k, v [Lk, Hkv, D]; Hq % Hkv == 0 (query head h uses kv head
    h // (Hq // Hkv)). Query i sits at absolute position q_offset + i and key j
    at position j; ``causal`` masks keys j > q_offset + i. ``scale`` defaults to
    1/sqrt(D). Computed in float32; returns [Lq, Hq, D] in q.dtype. Rows with no
    visible key return zeros.
    """
    group = _check_heads(q, k, v)
    lq, hq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # Repeat kv heads so a plain per-head einsum can be used: simple beats clever here.
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q.float(), kf) * scale
    if causal:
        q_pos = torch.arange(lq, device=q.device) + q_offset
        k_pos = torch.arange(k.shape[0], device=q.device)
        scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # all-masked rows: softmax gives NaN
    out = torch.einsum("hij,jhd->ihd", probs, vf)
    return out.to(q.dtype)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    q_offset: int = 0, scale: float | None = None,
                    block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """Tiled attention with an online softmax (FlashAttention-2 style).

    Same semantics as :func:`naive_attention`. Loops over row blocks of q and
    column blocks of k/v, keeping a running max ``m``, running sum ``l`` and a
    rescaled float32 accumulator per row; column blocks entirely in the causal
    future of a row block are skipped, and the Lq x Lk score matrix is never
    built. All heads of a tile are processed together.
    """
    group = _check_heads(q, k, v)
    if block_q < 1 or block_k < 1:
        raise ValueError("block sizes must be positive")
    if q_offset < 0:
        raise ValueError("q_offset must be >= 0")
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # [Lq, Hkv, G, D]: query head h = kv_head * G + g, matching h // G == kv_head.
    qg = q.float().reshape(lq, hkv, group, d)
    kf, vf = k.float(), v.float()
    out = torch.empty(lq, hkv, group, d, dtype=torch.float32, device=q.device)

    for qs in range(0, lq, block_q):
        qe = min(qs + block_q, lq)
        # Fold the scale into q once per tile rather than into every score tile.
        q_tile = qg[qs:qe] * scale
        q_pos = torch.arange(qs, qe, device=q.device) + q_offset
        m = torch.full((hkv, group, qe - qs), float("-inf"), device=q.device)
        l = torch.zeros(hkv, group, qe - qs, device=q.device)
        acc = torch.zeros(hkv, group, qe - qs, d, device=q.device)
        # The last row of the tile sees keys up to q_offset + qe - 1; later blocks are all masked.
        k_stop = min(lk, q_offset + qe) if causal else lk
        for ks in range(0, k_stop, block_k):
            ke = min(ks + block_k, lk)
            s = torch.einsum("ihgd,jhd->hgij", q_tile, kf[ks:ke])
            # Only tiles crossing the diagonal need a mask; the rest are fully visible.
            if causal and ke - 1 > q_offset + qs:
                k_pos = torch.arange(ks, ke, device=q.device)
                s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_ref = _finite_max(m_new)
            # Online-softmax rule: rescale old l and acc by exp(m_old - m_new).
            alpha = torch.exp(m - m_ref)
            p = torch.exp(s - m_ref.unsqueeze(-1))
            l = alpha * l + p.sum(dim=-1)
            acc = alpha.unsqueeze(-1) * acc + torch.einsum("hgij,jhd->hgid", p, vf[ks:ke])
            m = m_new
        out[qs:qe] = _normalise(acc, l).permute(2, 0, 1, 3)
    return out.reshape(lq, hq, d).to(q.dtype)


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, context_len: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one sequence's first ``context_len`` positions out of a paged KV cache.

    k_cache/v_cache [num_blocks, block_size, Hkv, D]; ``block_table`` is a 1-D
    int64 tensor of block ids, possibly longer than needed. Returns contiguous
    k, v of shape [context_len, Hkv, D].
    """
    if context_len < 0:
        raise ValueError("context_len must be >= 0")
    block_size = k_cache.shape[1]
    n_blocks = -(-context_len // block_size)
    if n_blocks > block_table.numel():
        raise ValueError(f"block_table has {block_table.numel()} ids, need {n_blocks}")
    ids = block_table[:n_blocks].long()
    # Advanced indexing copies, so the slices below are already contiguous.
    k = k_cache[ids].reshape(-1, *k_cache.shape[2:])[:context_len]
    v = v_cache[ids].reshape(-1, *v_cache.shape[2:])[:context_len]
    return k.contiguous(), v.contiguous()


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, blocks_per_split: int = 4) -> torch.Tensor:
    """Split-KV (FlashDecoding) attention of one query token per sequence over a paged cache.

    q [B, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D];
    block_tables [B, max_blocks] int64, padded past each sequence's blocks with
    any valid id; context_lens [B] int64, each >= 1. Position p of sequence b is
    k_cache[block_tables[b, p // block_size], p % block_size]. The context is cut
    into splits of ``blocks_per_split`` blocks, each split yields (m, l, o) and the
    splits are merged with the online-softmax rule. Batch and splits are handled
    with tensor ops. Returns [B, Hq, D] in q.dtype; accumulates in float32.
    """
    if blocks_per_split < 1:
        raise ValueError("blocks_per_split must be >= 1")
    b, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if b == 0:
        return q.new_empty(b, hq, d)

    # Only as many blocks as the longest sequence needs; padding the table to a
    # whole number of splits with block 0 is safe because those positions are masked.
    max_ctx = int(context_lens.max())
    n_blocks = -(-max_ctx // block_size)
    if n_blocks > block_tables.shape[1]:
        raise ValueError("block_tables is too short for context_lens")
    n_splits = -(-n_blocks // blocks_per_split)
    tables = torch.zeros(b, n_splits * blocks_per_split, dtype=torch.long, device=q.device)
    tables[:, :n_blocks] = block_tables[:, :n_blocks]
    tables = tables.view(b, n_splits, blocks_per_split)

    split_len = blocks_per_split * block_size
    # [B, S, T, Hkv, D] with T = tokens per split.
    k = k_cache[tables].float().reshape(b, n_splits, split_len, hkv, d)
    v = v_cache[tables].float().reshape(b, n_splits, split_len, hkv, d)
    pos = torch.arange(n_splits * split_len, device=q.device).view(n_splits, split_len)
    masked = pos[None] >= context_lens.to(q.device).view(b, 1, 1)  # [B, S, T]

    qg = q.float().reshape(b, hkv, group, d) * scale
    s = torch.einsum("bhgd,bsthd->bshgt", qg, k)
    s = s.masked_fill(masked[:, :, None, None, :], float("-inf"))
    # Per-split partials; splits wholly past the context get m = -inf, l = 0.
    m = s.amax(dim=-1)
    p = torch.exp(s - _finite_max(m).unsqueeze(-1))
    l = p.sum(dim=-1)
    o = torch.einsum("bshgt,bsthd->bshgd", p, v)
    out = merge_partials(m, l, o, dim=1)  # [B, Hkv, G, D]
    return out.reshape(b, hq, d).to(q.dtype)
