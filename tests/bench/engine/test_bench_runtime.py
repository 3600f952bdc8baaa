"""`bench runtime` at any batch size (issue 16: batch 1 failed on a 4096-token model), and its roofline."""
from __future__ import annotations

import pytest

from infersight.bench.engine.runtime import bench_runtime, roofline_step_ms
from infersight.runtime import EngineConfig, ModelConfig
from infersight.runtime.engine.engine import Engine

LONG = ModelConfig("br-long", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=4096)


@pytest.mark.parametrize("batch", [1, 3])
def test_any_batch_runs_on_a_long_context_model(batch: int) -> None:
    result = bench_runtime(model=LONG, batch=batch, prompt_len=8, decode_steps=6, repeats=1, compare_eager=True)  # type: ignore[arg-type]
    assert result.batch == batch and result.decode_step_ms > 0 and result.decode_tokens_per_s > 0
    assert result.cuda_graphs == "not a CUDA device" and result.eager_decode_step_ms is None
    assert result.roofline_share is None  # the roofline is the GPU's: CPU runs leave it out


def test_bad_anchor_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="hf_anchor must be none, eager or all"):
        bench_runtime(model=LONG, hf_anchor="compiled")  # type: ignore[arg-type]


def test_roofline_counts_weights_once_and_the_kv_of_every_sequence() -> None:
    engine = Engine(EngineConfig(model=LONG, dtype="bfloat16", max_model_len=64, num_kv_blocks=8))
    d, L, h, H, K, f, V = 32, 2, 8, 4, 2, 64, LONG.vocab_size
    weights = L * (d * H * h + 2 * d * K * h + H * h * d + 3 * d * f) + d * V  # embedding rows are not read
    kv = 5 * 2 * L * 100 * K * h  # 5 sequences of 100 tokens: K and V of every layer
    want_ms = (weights + kv) * 2 / 1000e9 * 1e3
    assert roofline_step_ms(engine, batch=5, context=100, gbps=1000.0) == pytest.approx(want_ms, rel=1e-9)


def test_prefill_flops_count_the_matmuls_and_the_causal_triangle() -> None:
    from infersight.bench.engine.runtime_prefill import prefill_flops

    d, L, h, H, K, f, V, n = 32, 2, 8, 4, 2, 64, LONG.vocab_size, 100
    matmuls = 2 * n * L * (d * H * h + 2 * d * K * h + H * h * d + 3 * d * f) + 2 * d * V  # one logits row
    attention = 4 * L * H * h * n * (n + 1) / 2  # QK^T and PV, each query against the keys up to it
    assert prefill_flops(LONG, n) == pytest.approx(matmuls + attention, rel=1e-12)


def test_long_prefill_runs_in_one_step_past_the_model_length(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from infersight.bench.engine.runtime_prefill import prefill_flops
    from infersight.kernels.ceilings.ceiling_cache import CeilingMeasurement, host_cpu_name, torch_version, write_cache

    monkeypatch.setenv("INFERSIGHT_CEILINGS", str(tmp_path / "ceilings.json"))  # this host's CPU: none measured
    unknown = bench_runtime(model=LONG, batch=1, prompt_len=8, decode_steps=3, repeats=1,  # type: ignore[arg-type]
                            prefill_len=16).long_prefill
    assert unknown is not None and unknown.share_of_gemm_ceiling is None
    assert f"ceiling known for {host_cpu_name()} (float32)" in unknown.gemm_ceiling
    # as `bench ceilings --device cpu` caches it
    gemm = CeilingMeasurement(host_cpu_name(), "float32", torch_version() or "none", "this-host",
                              "2026-12-01T00:00:00Z", "perf_counter", 7.5, 1 << 28, 0.04, 2048, 5, 2)
    write_cache(gemm)

    short = ModelConfig("br-short", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    result = bench_runtime(model=short, batch=1, prompt_len=8, decode_steps=3, repeats=1, prefill_len=100)  # type: ignore[arg-type]
    long = result.long_prefill
    assert long is not None and long.tokens == 100 and long.max_seq_len_raised  # 100 + 2 > 64: a longer RoPE table
    assert long.forward_ms is None  # no CUDA events on the CPU: the step's wall time is used
    flop = prefill_flops(short, 100)
    assert long.modelled_tflop == pytest.approx(flop / 1e12, rel=1e-3)
    # step_ms is rounded to the microsecond: the rate follows it to that precision
    assert long.modelled_tflops == pytest.approx(flop / (long.step_ms / 1e3) / 1e12, rel=2e-3)
    assert long.share_of_gemm_ceiling == pytest.approx(long.modelled_tflops / gemm.gemm_tflops, rel=2e-3)
    assert long.gemm_ceiling.startswith("0.04 TFLOP/s on CPU") and "measured:" in long.gemm_ceiling
    with pytest.raises(ValueError, match="prefill_len"):
        bench_runtime(model=short, prefill_len=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("flags, want", [([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)])
def test_async_scheduling_flags_on_serve_and_bench_runtime(flags: list[str], want: bool | None) -> None:
    """vLLM's flag, and its negation for the CUDA default (None: EngineConfig decides by device)."""
    from infersight.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve", *flags]).async_scheduling is want
    assert parser.parse_args(["bench", "runtime", *flags]).async_scheduling is want
