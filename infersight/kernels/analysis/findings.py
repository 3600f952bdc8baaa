"""Findings in plain words, each with the action that addresses it.

Inputs are the analysis frames (timeline.py, roofline.py, the ncu rules), never the raw capture;
every rule and its threshold is listed here. Severity: high, medium, info.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

from infersight.kernels.ceilings.device_ceilings import DeviceCeilings, rate_text

#: A phase is launch-bound when this share of its windows is idle between kernels (high / medium).
LAUNCH_BOUND_HIGH, LAUNCH_BOUND_MEDIUM = 0.5, 0.3
#: Phases with less GPU time than this share are not worth a finding of their own.
MIN_PHASE_SHARE = 0.05
#: Category shares of all GPU time above which the category gets a finding.
CATEGORY_LIMITS = {"memcpy": 0.10, "elementwise": 0.25, "MoE routing": 0.10, "MoE experts": 0.20,
                   "sampling": 0.10, "communication": 0.20}
#: Roofline: below this fraction of the roof (or, for decode attention, of peak bandwidth).
ROOF_FRACTION = 0.5
#: ncu: both speed-of-light throughputs below this -> latency-bound (ncu's own threshold is 60%).
LATENCY_BOUND_SOL = 0.6
#: ncu rule descriptions are paragraphs; the action keeps this many characters.
MAX_ACTION_CHARS = 300
#: ncu-measured DRAM bytes over the roofline's modelled bytes above which a category is moving
#: data it does not need to (and below the inverse of which caches served much of it).
EXCESS_BYTES_RATIO = 1.5
#: One kernel name with this share of GPU time is worth profiling on its own.
TOP_KERNEL_SHARE = 0.4
_SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}

_CATEGORY_ACTIONS = {
    "memcpy": "keep tensors on the GPU between steps; use pinned host memory with non_blocking copies, "
              "and overlap the rest with compute on a side stream",
    "elementwise": "fuse chains of small elementwise kernels (torch.compile, or fused norm/activation kernels)",
    "MoE routing": "use a fused top-k gating kernel instead of softmax + sort + gather",
    "MoE experts": "dispatch tokens with a fused MoE kernel (permute + grouped GEMM) instead of per-expert "
                   "gathers, index_add and copies",
    "sampling": "sample on the GPU with a fused kernel (top-k/top-p without a full-vocabulary sort) and "
                "avoid host synchronisation per token",
    "communication": "overlap collectives with compute, or reduce their volume (larger TP groups only when "
                     "the interconnect allows)",
}


@dataclass(frozen=True)
class Finding:
    severity: str
    text: str
    action: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _pct(x: float) -> str:
    """A share as a percentage, with decimals only where whole percents would read as 0%."""
    pct = 100 * x
    return f"{pct:.0f}%" if pct >= 1 or pct == 0 else f"{pct:.2g}%"


#: The launch-bound action when the kernels already come from CUDA-graph replays (kernels.analysis.step_findings).
GRAPH_REPLAY_ACTION = ("the kernels already replay as CUDA graphs: the gaps are host work between replays; overlap "
                       "the next step's scheduling, inputs and sampling with this step's GPU work (async "
                       "scheduling, as in vLLM), or move sampling into the graph")


def launch_findings(phases: pd.DataFrame, has_timeline: bool) -> list[Finding]:
    """Phases whose windows are mostly gaps between kernels: the GPU waits on the CPU."""
    if not has_timeline:
        return []
    out = []
    for row in phases.itertuples(index=False):
        if row.share < MIN_PHASE_SHARE or row.window_ns <= 0 or row.idle_share < LAUNCH_BOUND_MEDIUM:
            continue
        severity = "high" if row.idle_share >= LAUNCH_BOUND_HIGH else "medium"
        per_step = f", {row.activities / row.steps:.0f} kernels per step" if row.steps else ""
        window = "step time" if row.steps else "time on the GPU"
        out.append(Finding(severity, f"{row.phase} is launch-bound: {_pct(row.idle_share)} of its {window} "
                           f"is gaps between kernels (mean kernel {row.mean_kernel_ns / 1e3:.1f} µs{per_step})",
                           "capture it in CUDA graphs, or fuse small kernels (torch.compile), so the GPU does not "
                           "wait for the CPU to launch each one"))
    return out


def category_findings(categories: pd.DataFrame, kernels: pd.DataFrame) -> list[Finding]:
    """Categories above their CATEGORY_LIMITS share (high at twice the limit); copies also say how
    many bytes moved and how many came from pageable memory."""
    out = []
    for row in categories.itertuples(index=False):
        limit = CATEGORY_LIMITS.get(row.op_category)
        if limit is None or row.share < limit:
            continue
        severity = "high" if row.share >= 2 * limit else "medium"
        text = f"{row.op_category} takes {_pct(row.share)} of GPU time ({row.count} activities)"
        if row.op_category == "memcpy":
            pageable = kernels["name"].str.contains("Pageable", regex=False).sum()
            moved = int(kernels.loc[kernels["category"] == "gpu_memcpy", "bytes"].sum())
            text += f", {moved / 1e9:.2f} GB moved" + (f", {pageable} from pageable memory" if pageable else "")
        out.append(Finding(severity, text, _CATEGORY_ACTIONS[row.op_category]))
    return out


def _ceiling_said(ceilings: DeviceCeilings | None, memory: bool) -> str:
    """" (4,800 GB/s, datasheet)": which peak a share is of, and where it came from."""
    if ceilings is None:
        return ""
    source = ceilings.gbps_source if memory else ceilings.tflops_source
    value = f"{rate_text(ceilings.peak_gbps)} GB/s" if memory else f"{rate_text(ceilings.peak_tflops)} TFLOP/s"
    return f" ({value}, {source.kind if source else 'given'})"


def roofline_findings(roofline: pd.DataFrame, phase: str, ceilings: DeviceCeilings | None = None) -> list[Finding]:
    """GEMM and attention below ROOF_FRACTION of their roof (the other rows are too small to tune).
    ceilings: the ones the rows were placed against, named in the text with their source."""
    out = []
    memory_said, compute_said = _ceiling_said(ceilings, True), _ceiling_said(ceilings, False)
    for row in roofline.itertuples(index=False):
        if row.op_category not in ("GEMM", "attention-prefill", "attention-decode"):
            continue
        where = f"{phase} {row.op_category}" if phase else row.op_category
        if row.op_category == "attention-decode" and row.pct_of_peak_bw < ROOF_FRACTION:
            out.append(Finding("high" if row.pct_of_peak_bw < ROOF_FRACTION / 2 else "medium",
                               f"decode attention reaches {_pct(row.pct_of_peak_bw)} of memory bandwidth{memory_said} "
                               f"({row.achieved_gbps:.0f} GB/s reading the KV cache)",
                               "stream the KV cache across every SM: a split-KV (FlashDecoding) paged kernel with "
                               "enough splits and wide tile loads, with RoPE and the KV write fused in"))
        elif row.bound == "memory" and row.pct_of_roof < ROOF_FRACTION:
            out.append(Finding("medium", f"{where} is memory-bound (intensity {row.intensity:.1f} FLOP/B) and "
                               f"reaches {_pct(row.pct_of_roof)} of the memory roof{memory_said}",
                               "raise arithmetic intensity: batch more tokens per step, or quantize weights / KV"))
        elif row.bound == "compute" and row.pct_of_roof < ROOF_FRACTION:
            out.append(Finding("medium", f"{where} is compute-bound and reaches {_pct(row.pct_of_roof)} of "
                               f"peak{compute_said} ({row.achieved_tflops:.1f} TFLOP/s)",
                               "use tensor-core friendly dtypes and shapes (bf16/fp8, multiples of 64), "
                               "and fused attention kernels"))
    return out


_EXCESS_ACTIONS = {
    "attention-decode": "read the KV cache once per step: a fused paged-attention kernel instead of gathering "
                        "and up-casting copies of it",
    "attention-prefill": "use a fused (FlashAttention) kernel so scores and gathered K/V never reach DRAM",
    "GEMM": "weights are read more than once per step: check split-K / tiling, or fuse the projections",
}


def byte_model_findings(roofline: pd.DataFrame) -> list[Finding]:
    """Where ncu measured DRAM bytes (roofline column measured_bytes): categories moving much more
    than the work needs, or much less (caches served it; the roofline's bandwidth is then optimistic)."""
    if "measured_bytes" not in roofline.columns:
        return []
    out = []
    for row in roofline.itertuples(index=False):
        if not row.measured_bytes > 0 or not row.bytes > 0:
            continue
        ratio = row.measured_bytes / row.bytes
        said = (f"{row.measured_bytes / 1e9:.3g} GB measured by ncu vs {row.bytes / 1e9:.3g} GB the work needs")
        if ratio > EXCESS_BYTES_RATIO:
            out.append(Finding("high" if ratio > 2 * EXCESS_BYTES_RATIO else "medium",
                               f"{row.op_category} moves {ratio:.1f}x the DRAM bytes it must ({said})",
                               _EXCESS_ACTIONS.get(row.op_category, "find the copies: fuse kernels so "
                                                   "intermediates stay in registers or shared memory")))
        elif ratio < 1 / EXCESS_BYTES_RATIO:
            out.append(Finding("info", f"{row.op_category} moves only {ratio:.2f}x the modelled bytes ({said}): "
                               "caches served part of it", "read its bandwidth figure as an upper bound"))
    return out


def top_kernel_findings(top: pd.DataFrame) -> list[Finding]:
    """One kernel name holding TOP_KERNEL_SHARE of GPU time is worth profiling alone."""
    if top.empty or top["share"].iloc[0] < TOP_KERNEL_SHARE:
        return []
    row = top.iloc[0]
    name = row["name"] if len(row["name"]) <= 80 else row["name"][:77] + "..."
    return [Finding("info", f"one kernel takes {_pct(row['share'])} of GPU time: {name}",
                    "profile it on its own with Nsight Compute (ncu --set full -k <name>)")]


def sol_findings(metrics: pd.DataFrame) -> list[Finding]:
    """ncu kernels far below both speed-of-light throughputs: latency-bound (too little parallel
    work in flight), which neither more bandwidth nor more FLOPs would fix."""
    sol = metrics[metrics["metric"].isin(["Compute (SM) Throughput", "Memory Throughput"]) &
                  (metrics["base_unit"] == "ratio")]
    out = []
    for kid, rows in sol.groupby("kernel_id"):
        values = dict(zip(rows["metric"], rows["value"]))
        if len(values) == 2 and max(values.values()) < LATENCY_BOUND_SOL:
            name = str(rows["name"].iloc[0])
            out.append(Finding("medium", f"kernel {kid} ({name[:60]}) is latency-bound: "
                               f"{_pct(values['Compute (SM) Throughput'])} of compute and "
                               f"{_pct(values['Memory Throughput'])} of memory speed-of-light",
                               "put more work in flight: raise occupancy (fewer registers / less shared "
                               "memory per block), or give the kernel more blocks (avoid partial waves)"))
    return out


def ncu_findings(rules: pd.DataFrame, limit: int = 3) -> list[Finding]:
    """The ncu rules with the largest estimated speedup, their own advice as the action."""
    ranked = rules[rules["speedup"].notna()].sort_values("speedup", ascending=False, kind="stable").head(limit)
    out = []
    for row in ranked.itertuples(index=False):
        scope = f" ({row.speedup_type})" if row.speedup_type else ""
        out.append(Finding("medium" if row.speedup >= 20 else "info",
                           f"ncu {row.rule}{scope}: estimated speedup {row.speedup:.0f}% on kernel {row.kernel_id}",
                           _clip(str(row.description))))
    return out


def range_findings(kernels: pd.DataFrame) -> list[Finding]:
    """A capture without ranges can say where time goes by kernel, not by phase."""
    if kernels.empty or (kernels["range_path"] != "").any():
        return []
    return [Finding("info", "no kernel is inside an NVTX or record_function range, so there is no per-phase "
                    "breakdown", "run the engine with infersight probes (NVTX ranges), or wrap phases in "
                    "torch.profiler.record_function / nvtx ranges")]


def _clip(text: str) -> str:
    if len(text) <= MAX_ACTION_CHARS:
        return text
    cut = text[:MAX_ACTION_CHARS].rsplit(". ", 1)[0]
    return cut + ("." if not cut.endswith(".") else "") + " (...)"


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """High first, then medium, then info; the order within a severity is kept."""
    return sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))
