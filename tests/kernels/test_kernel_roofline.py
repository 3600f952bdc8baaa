"""Roofline arithmetic on a tiny hand-computed case, and the phase-level placement."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.kernels.analysis.roofline import DeviceCeilings, StepShape, analytic_work, place_on_roofline, roofline_for_phase
from infersight.runtime.config import ModelConfig

# d_model 4, 2 heads of 2 (hh = 4), 1 KV head (kh = 2), dense FFN 8, vocabulary 10, one layer.
TINY = ModelConfig("tiny-hand", d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=8, vocab_size=10)
# Peak 1 TFLOP/s and 100 GB/s: ridge = 1e12 / 1e11 = 10 FLOP/B.
CEIL = DeviceCeilings("hand", peak_tflops=1.0, peak_gbps=100.0)


def test_decode_work_by_hand() -> None:
    # attention weights 4*4 + 2*4*2 + 4*4 = 48, FFN 3*4*8 = 96, LM head 4*10 = 40.
    # decode, 2 sequences x 1 token, context 8, bf16:
    #   GEMM flops 2*2*(48+96) + 2*2*40 = 736; bytes (48+96+40)*2 = 368
    #   attention flops 4 * 1 layer * 2 seqs * 1 * 8 * 4 = 256; KV bytes 2*1*8*2*2 bytes*2 seqs = 128
    work = analytic_work(TINY, StepShape("decode", num_seqs=2, query_len=1, context_len=8)).set_index("op_category")
    assert work.loc["GEMM", "flops"] == 736 and work.loc["GEMM", "bytes"] == 368
    assert work.loc["attention-decode", "flops"] == 256 and work.loc["attention-decode", "bytes"] == 128
    assert "MoE routing" not in work.index


def test_prefill_work_by_hand() -> None:
    # prefill, 1 sequence of 6 tokens: attention 4 * 6^2 * 4 = 576 FLOPs (the 4*L^2*d rule);
    # bytes: Q and O 2*6*4 plus K and V 2*6*2 = 72 elements = 144 bytes.
    work = analytic_work(TINY, StepShape("prefill", num_seqs=1, query_len=6, context_len=6)).set_index("op_category")
    assert work.loc["attention-prefill", "flops"] == 576 and work.loc["attention-prefill", "bytes"] == 144
    assert work.loc["GEMM", "flops"] == 2 * 6 * 144 + 2 * 40


def test_moe_expected_experts_touched() -> None:
    moe = ModelConfig("tiny-moe-hand", d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=8, vocab_size=10,
                      n_experts=4, top_k=2)
    work = analytic_work(moe, StepShape("decode", 1, 1, 8)).set_index("op_category")
    # One token touches exactly top_k = 2 experts: weights 48 + 2*96 + 40 = 280, flops 2*(48 + 2*96) + 2*40.
    assert work.loc["GEMM", "bytes"] == 280 * 2 and work.loc["GEMM", "flops"] == 2 * 240 + 80
    assert work.loc["MoE routing", "flops"] == 2 * 4 * 4 and work.loc["MoE routing", "bytes"] == 4 * 4 * 2


def test_placement_by_hand() -> None:
    work = pd.DataFrame({"op_category": ["GEMM", "attention-prefill", "sampling"],
                         "flops": [2e6, 4e6, 1.0], "bytes": [1e6, 1e4, 1.0]})
    placed = place_on_roofline(work, pd.Series({"GEMM": 1000, "attention-prefill": 8000}), CEIL)
    g, a = placed.set_index("op_category").loc["GEMM"], placed.set_index("op_category").loc["attention-prefill"]
    # GEMM: 2e6 FLOP / 1e-6 s = 2e12 FLOP/s = 2.0 TFLOP/s; 1e6 B / 1e-6 s = 1000 GB/s.
    assert g["achieved_tflops"] == pytest.approx(2.0) and g["achieved_gbps"] == pytest.approx(1000.0)
    # intensity 2 < ridge 10: memory-bound, roof = 2 * 100 GB/s = 0.2 TFLOP/s.
    assert g["intensity"] == 2.0 and g["bound"] == "memory" and g["roof_tflops"] == pytest.approx(0.2)
    assert g["pct_of_roof"] == pytest.approx(10.0) and g["pct_of_peak_bw"] == pytest.approx(10.0)
    # attention: intensity 400 > 10, compute-bound, roof 1 TFLOP/s; 4e6 / 8 us = 0.5 TFLOP/s.
    assert a["bound"] == "compute" and a["roof_tflops"] == pytest.approx(1.0)
    assert a["achieved_tflops"] == pytest.approx(0.5) and a["pct_of_roof"] == pytest.approx(0.5)
    assert list(placed["op_category"]) == ["GEMM", "attention-prefill"]  # no time measured: dropped


def test_ridge_and_shape_validation() -> None:
    assert DeviceCeilings("hand", 2.0, 50.0).ridge == pytest.approx(2e12 / 50e9)  # FLOP/s over B/s
    with pytest.raises(ValueError):
        StepShape("train", 1, 1, 1)
    with pytest.raises(ValueError):
        StepShape("decode", 0, 1, 1)


def test_roofline_for_phase_multiplies_by_steps() -> None:
    classified = pd.DataFrame({"phase": ["decode"] * 3 + ["sampling"], "step_id": [0, 1, 1, 1],
                               "op_category": ["GEMM", "GEMM", "attention-decode", "sampling"],
                               "dur_ns": [500, 500, 256, 9]})
    shape = StepShape("decode", num_seqs=2, query_len=1, context_len=8)
    placed = roofline_for_phase(classified, TINY, shape, CEIL).set_index("op_category")
    assert placed.loc["GEMM", "flops"] == 2 * 736 and placed.loc["GEMM", "kernel_ns"] == 1000
    assert placed.loc["attention-decode", "bytes"] == 2 * 128
    assert roofline_for_phase(classified, TINY, StepShape("prefill", 1, 4, 4), CEIL).empty
