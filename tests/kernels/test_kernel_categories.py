"""Diagnosis categories from names and enclosing ranges, on a small synthetic frame."""
from __future__ import annotations

import pandas as pd
import pytest

from infersight.kernels.analysis.categories import CATEGORIES, classify, core_name
from infersight.kernels.analysis.paths import split_path

D = "step/forward.decode"
P = "step/forward.prefill"
ROWS = [
    # name, raw category, range_path, expected
    ("_rope_kv_kernel", "kernel", D, "attention-decode"),  # RoPE + KV write under a graph replay: no layer range
    ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", D, "memcpy"),
    ("Memset (Device)", "gpu_memset", "", "memcpy"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", D, "communication"),
    ("nvjet_sm90_tst_8x64_64x16_1x1_h_bz_TNN", "kernel", f"{D}/layer.0.moe.router", "MoE routing"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)", "kernel", f"{D}/layer.0.moe.router",
     "MoE routing"),
    ("void vllm::moe::topk_softmax<8, 8>(float const*, bool const*, float*, int*)", "kernel", "", "MoE routing"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4> >(Flash_fwd_params)", "kernel",
     f"{P}/layer.3.attention", "attention-prefill"),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)", "kernel",
     f"{D}/layer.3.attention", "attention-decode"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "kernel",
     "step/forward.mixed/layer.1.attention", "attention-prefill"),
    ("paged_attention_v2_kernel<__nv_bfloat16, 128>", "kernel", "", "attention-decode"),
    # a mixed step's decoding sequences run the paged decode kernel: its name decides, not the phase
    ("_paged_decode_split_kernel", "kernel", "step/forward.mixed/layer.1.attention", "attention-decode"),
    ("_paged_decode_merge_kernel", "kernel", "", "attention-decode"),
    ("fused_moe_kernel", "kernel", f"{D}/layer.2.moe.experts", "MoE experts"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "kernel", f"{D}/layer.2.moe.experts", "GEMM"),
    ("void at::native::indexFuncSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>(...)", "kernel",
     f"{D}/layer.2.moe.experts", "MoE experts"),
    ("ampere_sgemm_32x32_sliced1x4_tn", "kernel", "", "GEMM"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1>(Params)", "kernel",
     f"{D}/layer.0.attention", "GEMM"),
    ("void vllm::rms_norm_kernel<c10::BFloat16>(c10::BFloat16*, c10::BFloat16 const*)", "kernel",
     f"{D}/layer.0.attention", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int, ...)", "kernel",
     f"{D}/layer.0.attention", "attention-decode"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float> > >(...)",
     "kernel", "step/sampling", "sampling"),
    ("void at::native::_scatter_gather_elementwise_kernel<128, 8>(int, ...)", "kernel", "step/sampling", "sampling"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)", "kernel",
     "", "sampling"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::silu_kernel<c10::BFloat16> >(int, ...)",
     "kernel", f"{D}/layer.1.mlp", "elementwise"),
    # argument types must not decide: "reduced_divisor" is an argument, not a reduction
    ("void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, cudnn::reduced_divisor, bool)",
     "kernel", "", "other"),
    ("my_custom_kernel", "kernel", "", "other"),
]


def test_categories_on_a_synthetic_frame() -> None:
    frame = pd.DataFrame({"name": [r[0] for r in ROWS], "category": [r[1] for r in ROWS],
                          "range_path": [r[2] for r in ROWS], "dur_ns": 1, "step_id": 0})
    before = frame.copy()
    out = classify(frame)
    pd.testing.assert_frame_equal(frame, before)
    for row, got in zip(ROWS, out["op_category"]):
        assert got == row[3], row[0]
    assert set(out["op_category"]) <= set(CATEGORIES)
    assert classify(frame.iloc[0:0]).empty


@pytest.mark.parametrize("path,parts", [
    ("step/forward.decode/layer.3.attention", ("decode", 3, "attention")),
    ("step/forward.verify/layer.12.moe.experts", ("verify", 12, "moe.experts")),
    ("step/forward.prefill", ("prefill", -1, "")),
    ("step/sampling", ("sampling", -1, "sampling")),
    ("step/kv.swap_in", ("kv.swap_in", -1, "kv.swap_in")),
    ("step", ("step", -1, "")),
    ("[param|cuda]/[param|x|measure|forward]", ("[param|cuda]", -1, "[param|x|measure|forward]")),
    ("", ("(none)", -1, "")),
])
def test_split_path(path: str, parts: tuple[str, int, str]) -> None:
    assert split_path(path) == parts


def test_core_name_drops_the_parameter_list_only() -> None:
    assert core_name("void at::native::(anonymous namespace)::f<add<float> >(int, reduced)") == \
        "void at::native::anon::f<add<float> >"
    assert core_name("nvjet_sm90_tst") == "nvjet_sm90_tst"
