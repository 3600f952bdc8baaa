"""Each GPU activity's diagnosis category, from its name and its enclosing ranges.

Categories: GEMM, attention-prefill, attention-decode, MoE routing, MoE experts, norm,
elementwise, sampling, memcpy, communication, other. The first rule that matches wins:

 1. memcpy         raw category gpu_memcpy / gpu_memset, or a name with memcpy / memset
 2. communication  NCCL and collective kernels (nccl, all_reduce, all_gather, reduce_scatter, ...)
 3. MoE routing    anything inside a "layer.N.moe.router" range (the router GEMM, its softmax
                   and top-k are one unit of work), or a gating kernel by name (topk_softmax, ...)
 4. attention-*    attention kernels by name (flash, fmha, sdpa, attention, paged, ...), and RoPE /
                   KV-write kernels (rope, rotary): inside a "layer.N.attention" range they count as
                   attention (rule 9); a CUDA-graph replay has no per-layer range, so the name says it
 5. MoE experts    fused MoE kernels by name (fused_moe, moe_gemm, ...)
 6. GEMM           gemm, cutlass, cublas, xmma (sm80_xmma, sm90_xmma), nvjet, matmul, gemv, conv; on a
                   CPU trace (cpu_trace.py) oneDNN / mkldnn ops and aten::mm, addmm, bmm, baddbmm, linear
 7. norm           rms_norm, layer_norm, batch_norm, ... by name (before the range rules: a
                   norm that runs inside an attention range is still a norm)
 8. MoE experts    the other kernels inside "layer.N.moe.experts" (gathers, scatters, activations)
 9. attention-*    the other kernels inside "layer.N.attention" (RoPE, KV writes, softmax)
10. sampling       kernels inside a "sampling" range, or softmax / topk / multinomial / sort /
                   argmax by name
11. elementwise    elementwise, vectorized, reduce, index, gather, copy, fill, activations ...
12. other

attention-prefill vs -decode: a name that says decode (decode, split_kv, paged) -> decode, in any
phase (a mixed step runs the paged decode kernel for its decoding sequences); otherwise phase
prefill or mixed -> prefill, decode / verify / draft -> decode (one or a few query tokens over a
long KV), and with no phase -> prefill.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from infersight.kernels.analysis.paths import path_parts

CATEGORIES = ("GEMM", "attention-prefill", "attention-decode", "MoE routing", "MoE experts", "norm",
              "elementwise", "sampling", "memcpy", "communication", "other")

_MEMCPY = re.compile(r"memcpy|memset")
_COMM = re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|sendrecv")
_ROUTING = re.compile(r"topk_softmax|topk_gating|moe_align|gating_kernel|router")
_ATTENTION = re.compile(r"flash|fmha|sdpa|scaled_dot_product|attention|attn|paged_|xformers|mha_|_mha|"
                        r"rope_|_rope|rotary")
_MOE_EXPERTS = re.compile(r"fused_moe|moe_gemm|moe_mlp|expert")
_GEMM = re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|wgmma|hmma|implicit_convolve|scudnn|"
                   r"hcudnn|fprop|dgrad|wgrad|convolution|onednn|mkldnn|aten::(?:addmm|mm|bmm|baddbmm|linear)\b")
_NORM = re.compile(r"(rms|layer|batch|group|instance)_?norm|welford|bn_fw|bn_bw")
_SAMPLING = re.compile(r"softmax|topk|top_k|multinomial|argmax|sort|sampl|gumbel")
_ELEMENTWISE = re.compile(r"elementwise|vectorized|unrolled|reduce|index|gather|scatter|copy|fill|cat|"
                          r"where|arange|silu|gelu|relu|activation|pointwise|triton_poi|triton_red|add|mul|"
                          r"pow|exp|rsqrt|cast|transpose|permute|pool|dropout|embedding|nchwtonhwc|nhwctonchw|axpy")
_DECODE_NAME = re.compile(r"decode|split_?kv|paged")
_DECODE_PHASES = {"decode", "verify", "draft"}


def core_name(name: str) -> str:
    """The name without its parameter list, lower case: demangled names end in "(float*, int, ...)"
    whose argument types (e.g. "cudnn::reduced_divisor") would match the patterns by accident.
    Template arguments stay: functor names such as CUDAFunctor_add are what identify aten kernels."""
    low = name.lower().replace("(anonymous namespace)", "anon")
    depth = 0
    for i, ch in enumerate(low):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0 and i > 0:
            return low[:i]
    return low


def _attention(phase: str, name: str) -> str:
    if _DECODE_NAME.search(name) or phase in _DECODE_PHASES:
        return "attention-decode"
    return "attention-prefill"


def categorize_one(name: str, category: str, phase: str, op: str) -> str:
    """The category of one activity (name in any case; phase and op as from paths.split_path)."""
    low = core_name(name)
    if category in ("gpu_memcpy", "gpu_memset") or _MEMCPY.search(low):
        return "memcpy"
    if _COMM.search(low):
        return "communication"
    if op == "moe.router" or _ROUTING.search(low):
        return "MoE routing"
    if _ATTENTION.search(low):
        return _attention(phase, low)
    if _MOE_EXPERTS.search(low):
        return "MoE experts"
    if _GEMM.search(low):
        return "GEMM"
    if _NORM.search(low):
        return "norm"
    if op == "moe.experts":
        return "MoE experts"
    if op == "attention":
        return _attention(phase, low)
    if op == "sampling" or phase == "sampling" or _SAMPLING.search(low):
        return "sampling"
    if _ELEMENTWISE.search(low):
        return "elementwise"
    return "other"


def classify(kernels: pd.DataFrame) -> pd.DataFrame:
    """A new frame: `kernels` plus phase, layer, op (see paths.py) and op_category (above).
    Each distinct (name, category, phase, op) is classified once."""
    parts = path_parts(kernels["range_path"])
    out = kernels.assign(phase=parts["phase"], layer=parts["layer"], op=parts["op"])
    if out.empty:
        return out.assign(op_category=pd.Series(dtype=object))
    keys = out[["name", "category", "phase", "op"]].astype(str)
    codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
    labels = np.array([categorize_one(*u) for u in uniques], dtype=object)
    return out.assign(op_category=labels[codes])
