"""Roofline placement: analytic FLOPs and bytes per category against measured kernel time.

Work per step, from the model shape (infersight.runtime.config.ModelConfig) and a StepShape
(s sequences, q new tokens each, c tokens of context each; T = s*q tokens; L layers; d_model d;
H heads, K KV heads, h head_dim; b bytes per element):
- GEMM: 2 FLOPs per active weight per token. Active weights per layer: attention projections
  d*H*h + 2*d*K*h + H*h*d, plus the FFN (3*d*ffn dense; top_k*3*d*ffn for MoE, plus a shared
  expert); LM head d*vocab once per sequence. Bytes: every weight touched in the step, read once
  (for MoE, the expected number of distinct experts hit by T*top_k uniform picks). Activations
  are left out: next to weights they are small in decode, and prefill is compute-bound anyway.
- MoE routing: 2*d*E FLOPs per token; the router weights as bytes.
- attention: 4*q*c*H*h FLOPs per layer per sequence (QK^T and PV; for a fresh prompt q = c = l, the
  4*l^2*d rule, without halving for the causal mask). Prefill bytes: Q and O (2*q*H*h) and K, V
  (2*c*K*h) per layer per sequence. Decode bytes: the KV cache read, 2*L*c*K*h*b per sequence.

batch_work models one forward over sequences of any mix (prefill chunks and decodes, weights read
once); steps_work sums it over a capture's steps (its shapes file, infersight.kernels.readers.shapes);
analytic_work is the uniform case the CLI's --batch/--context describe. measured_dram_bytes reads
ncu's DRAM counters per category, so the byte model can be checked against the hardware.

Achieved TFLOP/s and GB/s = work / kernel time of that category: modelled work over measured
time. The verdict compares the arithmetic intensity (FLOPs per byte) with the device's ridge point,
peak FLOP/s / peak B/s. The peaks (DeviceCeilings, kernels.ceilings.device_ceilings) each name their source:
measured by `infersight bench ceilings`, a datasheet, or given; with no ceiling known (None) the
roof columns are NaN and the bound "unknown".
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from infersight.kernels.ceilings.device_ceilings import DeviceCeilings
from infersight.kernels.frames import empty_frame

if TYPE_CHECKING:  # runtime.config imports torch; analysing a capture must not need it
    from infersight.runtime.config import ModelConfig

WORK_COLUMNS = {"op_category": "object", "flops": "float64", "bytes": "float64"}
ROOFLINE_COLUMNS = {"op_category": "object", "flops": "float64", "bytes": "float64", "kernel_ns": "int64",
                    "intensity": "float64", "achieved_tflops": "float64", "achieved_gbps": "float64",
                    "bound": "object", "roof_tflops": "float64", "pct_of_roof": "float64",
                    "pct_of_peak_flops": "float64", "pct_of_peak_bw": "float64"}


@dataclass(frozen=True)
class StepShape:
    """One step's shape. phase: prefill or decode. num_seqs: sequences in the batch; query_len:
    new tokens per sequence (decode: 1, more with speculation); context_len: tokens each attends
    to (prefill of a fresh prompt: = query_len; decode: the KV length). dtype_bytes: 2 for bf16."""

    phase: str
    num_seqs: int
    query_len: int
    context_len: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if self.phase not in ("prefill", "decode"):
            raise ValueError(f"phase must be prefill or decode, got {self.phase!r}")
        if min(self.num_seqs, self.query_len, self.context_len, self.dtype_bytes) < 1:
            raise ValueError("num_seqs, query_len, context_len and dtype_bytes must be >= 1")

    @property
    def tokens(self) -> int:
        return self.num_seqs * self.query_len


def _ffn_weights(m: ModelConfig, tokens: int) -> tuple[float, float]:
    """(active FFN weights per token, FFN weights touched in the step) for one layer."""
    expert = 3.0 * m.d_model * m.ffn_dim
    if not m.is_moe:
        return expert, expert
    shared = expert if m.shared_expert else 0.0
    # Expected distinct experts when tokens*top_k picks are spread uniformly over n_experts.
    touched = m.n_experts * (1.0 - (1.0 - m.top_k / m.n_experts) ** tokens)
    return m.top_k * expert + shared, touched * expert + shared


def batch_work(model: ModelConfig, query_lens: Sequence[int], context_lens: Sequence[int], dtype_bytes: int = 2,
               decode: Sequence[bool] | None = None) -> pd.DataFrame:
    """op_category, flops, bytes for one forward over a batch: sequence i feeds query_lens[i] new
    tokens that attend to context_lens[i] tokens (see the module docstring). decode[i]: count its
    attention as attention-decode (default: query_len == 1), else attention-prefill. Weights are
    read once for the whole batch however its sequences split between prefill and decode."""
    m, b = model, dtype_bytes
    q = np.asarray(query_lens, dtype=np.float64)
    c = np.asarray(context_lens, dtype=np.float64)
    is_decode = q == 1 if decode is None else np.asarray(decode, dtype=bool)
    tokens, seqs = float(q.sum()), len(q)
    d, hh, kh = m.d_model, m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    attn_w = d * hh + 2.0 * d * kh + hh * d
    ffn_active, ffn_touched = _ffn_weights(m, int(tokens))
    rows = [("GEMM", 2.0 * tokens * m.n_layers * (attn_w + ffn_active) + 2.0 * seqs * d * m.vocab_size,
             (m.n_layers * (attn_w + ffn_touched) + d * m.vocab_size) * b)]
    attn_flops = 4.0 * m.n_layers * q * c * hh
    if (~is_decode).any():
        pre = ~is_decode
        rows.append(("attention-prefill", float(attn_flops[pre].sum()),
                     float(m.n_layers * (2.0 * q[pre] * hh + 2.0 * c[pre] * kh).sum() * b)))
    if is_decode.any():
        rows.append(("attention-decode", float(attn_flops[is_decode].sum()),
                     float(2.0 * m.n_layers * c[is_decode].sum() * kh * b)))
    if m.is_moe:
        rows.append(("MoE routing", 2.0 * tokens * m.n_layers * d * m.n_experts, float(m.n_layers * d * m.n_experts * b)))
    return pd.DataFrame(rows, columns=list(WORK_COLUMNS)).astype(WORK_COLUMNS)


def analytic_work(model: ModelConfig, shape: StepShape) -> pd.DataFrame:
    """op_category, flops, bytes for one step of a uniform `shape` (see the module docstring)."""
    n = shape.num_seqs
    return batch_work(model, [shape.query_len] * n, [shape.context_len] * n, shape.dtype_bytes,
                      [shape.phase == "decode"] * n)


def steps_work(model: ModelConfig, steps: pd.DataFrame, dtype_bytes: int = 2) -> pd.DataFrame:
    """The summed work of captured steps. steps: one row per (step, sequence) with step_id,
    query_len, context_len (after the step's tokens) and phase (the step's: prefill, decode,
    mixed, verify); a verify step's attention counts as decode, like its kernels."""
    parts = [batch_work(model, g["query_len"], g["context_len"], dtype_bytes,
                        (g["query_len"] == 1) | (g["phase"] == "verify"))
             for _, g in steps.groupby("step_id", sort=True)]
    if not parts:
        return empty_frame(WORK_COLUMNS)
    total = pd.concat(parts).groupby("op_category", sort=False)[["flops", "bytes"]].sum().reset_index()
    return total.astype(WORK_COLUMNS)


def place_on_roofline(work: pd.DataFrame, kernel_ns: pd.Series,
                      ceilings: DeviceCeilings | None = DeviceCeilings()) -> pd.DataFrame:
    """Join work (op_category, flops, bytes; for the same steps as the time) with kernel_ns
    (index op_category). Categories without measured time are dropped. Columns: op_category,
    flops, bytes, kernel_ns, intensity (FLOP/byte), achieved_tflops, achieved_gbps, bound (memory
    when intensity < ridge, else compute), roof_tflops (min(peak, intensity * peak B/s)),
    pct_of_roof, pct_of_peak_flops, pct_of_peak_bw (fractions, 1.0 = at the ceiling). ceilings None
    (none known): bound "unknown" and the roof and pct columns NaN."""
    df = work.assign(kernel_ns=work["op_category"].map(kernel_ns).fillna(0).astype(np.int64))
    df = df[df["kernel_ns"] > 0]
    if df.empty:
        return empty_frame(ROOFLINE_COLUMNS)
    seconds = df["kernel_ns"] / 1e9
    intensity = df["flops"] / df["bytes"].where(df["bytes"] > 0, np.nan)
    tflops = df["flops"] / seconds / 1e12
    gbps = df["bytes"] / seconds / 1e9
    out = df.assign(intensity=intensity, achieved_tflops=tflops, achieved_gbps=gbps)
    if ceilings is None:
        out = out.assign(bound="unknown", roof_tflops=np.nan, pct_of_roof=np.nan, pct_of_peak_flops=np.nan,
                         pct_of_peak_bw=np.nan)
    else:
        roof = np.minimum(ceilings.peak_tflops, intensity * ceilings.peak_gbps / 1e3)
        out = out.assign(bound=np.where(intensity < ceilings.ridge, "memory", "compute"), roof_tflops=roof,
                         pct_of_roof=tflops / roof, pct_of_peak_flops=tflops / ceilings.peak_tflops,
                         pct_of_peak_bw=gbps / ceilings.peak_gbps)
    return out[list(ROOFLINE_COLUMNS)].astype(ROOFLINE_COLUMNS).reset_index(drop=True)


def roofline_for_phase(classified: pd.DataFrame, model: ModelConfig, shape: StepShape,
                       ceilings: DeviceCeilings | None = DeviceCeilings()) -> pd.DataFrame:
    """place_on_roofline for the kernels of one phase (classify()'s phase == shape.phase): the
    work of one step times the number of distinct steps measured (1 when there are no steps)."""
    k = classified[classified["phase"] == shape.phase]
    if k.empty:
        return empty_frame(ROOFLINE_COLUMNS)
    steps = max(int(k.loc[k["step_id"] >= 0, "step_id"].nunique()), 1)
    work = analytic_work(model, shape)
    work = work.assign(flops=work["flops"] * steps, bytes=work["bytes"] * steps)
    return place_on_roofline(work, k.groupby("op_category")["dur_ns"].sum(), ceilings)


def roofline_for_steps(classified: pd.DataFrame, model: ModelConfig, steps: pd.DataFrame, dtype_bytes: int = 2,
                       ceilings: DeviceCeilings | None = DeviceCeilings()) -> pd.DataFrame:
    """place_on_roofline for a capture whose steps are known one by one (steps as in steps_work,
    e.g. a capture's shapes file). Kernels are those of these steps when the trace has step ids,
    else all of them (an ncu capture of exactly that window)."""
    k = classified
    if (k["step_id"] >= 0).any():
        k = k[k["step_id"].isin(steps["step_id"].unique())]
    if k.empty:
        return empty_frame(ROOFLINE_COLUMNS)
    return place_on_roofline(steps_work(model, steps, dtype_bytes), k.groupby("op_category")["dur_ns"].sum(),
                             ceilings)


#: ncu metrics of DRAM traffic: read + write when both were collected, else the total.
DRAM_METRICS = (("dram__bytes_read.sum", "dram__bytes_write.sum"), ("dram__bytes.sum",))


def measured_dram_bytes(classified: pd.DataFrame, metrics: pd.DataFrame) -> pd.Series:
    """Bytes moved to and from DRAM per op_category, from an ncu capture's metrics (kernel_id =
    the kernels frame's correlation). Empty when no DRAM metric was collected."""
    for names in DRAM_METRICS:
        rows = metrics[metrics["metric"].isin(names) & metrics["value"].notna()]
        if set(rows["metric"]) == set(names):
            per_kernel = rows.groupby("kernel_id")["value"].sum()
            category = classified.set_index("correlation")["op_category"]
            joined = pd.DataFrame({"bytes": per_kernel, "op_category": category.reindex(per_kernel.index)})
            return joined.groupby("op_category")["bytes"].sum()
    return pd.Series(dtype=np.float64)


def with_measured_bytes(placed: pd.DataFrame, measured: pd.Series) -> pd.DataFrame:
    """placed plus measured_bytes (NaN where not measured) and model_error (modelled bytes /
    measured - 1: how far the roofline's byte model is from the hardware counters)."""
    got = placed["op_category"].map(measured).astype(np.float64)
    return placed.assign(measured_bytes=got, model_error=placed["bytes"] / got - 1.0)
