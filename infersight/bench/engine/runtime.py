"""`infersight bench runtime`: prefill and decode of the reference runtime, against the roofline.

Prefill: a batch of prompts fed through one step each (max_tokens=1, prefix cache off).
Decode: a batch of requests already past prefill; the median wall time of whole engine steps
(schedule, inputs, forward, sampling: what a user waits for), each between device syncs (with async
scheduling, back to back). The same steps are also timed as one block (bench.engine.decode_block:
decode_block, the wall clock of all of them over their number, against the median).
With CUDA graphs on, compare_eager runs the first half of the decode steps as graphs and the
second half eagerly, on the same engine and requests (the graphs are switched off). Blocks, not
alternating steps: a slow eager step leaves the GPU idle long enough to lower its clocks, which
would bill the next graph step. graph_replay_ms is the device time of the decode graph alone.

The roofline is the decode step's bytes (weights read once, plus the KV cache at the mean
decode context: infersight.kernels.analysis.roofline) over the device's copy bandwidth, measured by
`infersight bench ceilings` when cached, else its datasheet's (kernels.ceilings.ceiling_lookup;
roofline_ceiling names which); roofline_share = roofline time / step time. hf_anchor adds Hugging
Face transformers on the same shape in the same process (bench.engine.hf_anchor): "eager", or "all" for
eager and static-cache + torch.compile. The KV pool is sized for this run only: max_model_len = prompt + decode steps.
prefill_len N adds one N-token prompt prefilled in one step, in modelled TFLOP/s against the GEMM
ceiling (bench.engine.runtime_prefill), in a second engine after the first is gone.
fused_forward (default) runs CUDA forwards through runtime.model.forward_fused; False (--unfused) through
Transformer.forward. graph_io says whether the decode graphs copy their inputs and greedy tokens
themselves (runtime.runner.graph_tokens), so a greedy step is one launch.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from infersight.bench.engine.decode_block import DecodeBlockClock, DecodeBlockTiming
from infersight.bench.engine.runtime_prefill import LongPrefillResult, bench_long_prefill
from infersight.bench.engine.timing import replay_ms, sync, timed_step
from infersight.runtime import Engine, EngineConfig, SamplingParams
from infersight.runtime.runner.cuda_graphs import DecodeGraphs


@dataclass
class RuntimeBenchResult:
    model: str
    device: str
    dtype: str
    decode_attention: str
    batch: int
    prompt_len: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    decode_step_ms: float
    machine: str
    cuda_graphs: str = "off"            # "on", or why not
    compile_layers: bool = False
    eager_decode_step_ms: float | None = None
    graph_replay_ms: float | None = None  # device time of the decode graph alone (CUDA events)
    roofline_step_ms: float | None = None
    roofline_share: float | None = None
    eager_roofline_share: float | None = None
    roofline_ceiling: str | None = None  # the bandwidth the roofline used and its source (measured / datasheet)
    hf_eager_step_ms: float | None = None
    hf_static_compile_step_ms: float | None = None
    hf_note: str | None = None
    fused_forward: bool = False
    graph_io: bool | None = None       # the decode graphs copy their inputs and greedy tokens themselves
    long_prefill: LongPrefillResult | None = None
    async_scheduling: bool = False
    temperature: float = 0.0
    decode_gemv: bool = False          # batch-1 projections through runtime.model.triton_gemv (fused forward only)
    launched_ahead_share: float | None = None  # async: the timed steps launched before the one before was read
    decode_block: DecodeBlockTiming | None = None  # decode_step_ms's steps timed as one block (bench.engine.decode_block)


def roofline_step_ms(engine: Engine, batch: int, context: int, gbps: float | None = None) -> float:
    """ms to move one decode step's weight and KV bytes at `gbps` (default: the H200 datasheet's,
    kernels.ceilings.device_ceilings.DeviceCeilings; bench_runtime passes the looked-up ceiling)."""
    from infersight.kernels.analysis.roofline import DeviceCeilings, StepShape, analytic_work

    dtype_bytes = engine.config.torch_dtype.itemsize
    work = analytic_work(engine.config.model_config, StepShape("decode", batch, 1, context, dtype_bytes))
    return float(work["bytes"].sum()) / ((gbps or DeviceCeilings().peak_gbps) * 1e9) * 1e3


def replay_alone_ms(graphs: DecodeGraphs, n: int = 20) -> float:
    """Median device ms of the most recently used decode graph replayed alone (its inputs are the
    last step's, so it rewrites the same K/V slots with the same values)."""
    return round(replay_ms(list(graphs.graphs.values())[-1][0], n), 4)


def _hf_anchor(result: RuntimeBenchResult, config: EngineConfig, modes: list[str], steps: int) -> None:
    try:
        from infersight.bench.engine.hf_anchor import hf_decode_step_ms, hf_model

        model = hf_model(config.model_config, config.torch_dtype, config.device)
    except (ImportError, ValueError) as exc:
        result.hf_note = f"no transformers anchor: {exc}"
        return
    notes = []
    for mode in modes:
        try:
            ms = hf_decode_step_ms(model, result.batch, result.prompt_len, steps, mode)
        except Exception as exc:  # noqa: BLE001 -- a mode that does not run here is reported, not fatal
            notes.append(f"{mode} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            continue
        setattr(result, "hf_eager_step_ms" if mode == "eager" else "hf_static_compile_step_ms", ms)
    result.hf_note = "; ".join(notes) or None
    del model
    if config.device.startswith("cuda"):
        torch.cuda.empty_cache()


def bench_runtime(model: str = "tiny-moe", device: str = "cpu", dtype: str = "float32", batch: int = 16,
                  prompt_len: int = 128, decode_steps: int = 32, repeats: int = 3, seed: int = 0,
                  decode_attention: str = "auto", enforce_eager: bool = False, compare_eager: bool = False,
                  hf_anchor: str = "none", compile_layers: bool = False, fused_forward: bool = True,
                  prefill_len: int = 0, async_scheduling: bool | None = None, decode_gemv: bool = True,
                  temperature: float = 0.0) -> RuntimeBenchResult:
    """Measure one shape; see the module docstring. hf_anchor: none, eager or all. temperature: of
    the decode requests (0: greedy; above: sampled with a seed per request)."""
    if hf_anchor not in ("none", "eager", "all"):
        raise ValueError(f"hf_anchor must be none, eager or all, got {hf_anchor!r}")
    if prefill_len < 0 or prefill_len == 1:
        raise ValueError("prefill_len must be 0 (none) or >= 2")
    if min(batch, prompt_len, repeats) < 1:
        raise ValueError("batch, prompt_len and repeats must be >= 1")
    if decode_steps < (6 if compare_eager else 3):
        raise ValueError("decode_steps must be >= 3 (>= 6 with compare_eager): each mode's first two steps are "
                         "warm-up")
    block = 16
    max_model_len = prompt_len + decode_steps + 2
    per_seq = -(-max_model_len // block)
    config = EngineConfig(model=model, device=device, dtype=dtype, seed=seed, enable_prefix_caching=False,
                          decode_attention=decode_attention, max_num_seqs=batch,
                          max_num_batched_tokens=batch * prompt_len, block_size=block,
                          max_model_len=max_model_len, num_kv_blocks=batch * per_seq + 4,
                          enforce_eager=enforce_eager, compile_layers=compile_layers, fused_forward=fused_forward,
                          async_scheduling=async_scheduling, decode_gemv=decode_gemv)
    engine = Engine(config)
    gen = torch.Generator().manual_seed(seed)
    vocab = config.model_config.vocab_size

    def prompts() -> list[list[int]]:
        return [torch.randint(0, min(vocab, 256), (prompt_len,), generator=gen).tolist() for _ in range(batch)]

    def drain() -> None:
        while engine.has_unfinished():
            engine.step()

    # Warm-up once, then time whole prefill steps (every request prefills in one step).
    prefill_rates = []
    for i in range(repeats + 1):
        for p in prompts():
            engine.add_request(p, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        stats, dt = timed_step(engine, device)
        drain()
        if i:
            prefill_rates.append(stats.num_prefill_tokens / dt)
    for p in prompts():
        engine.add_request(p, SamplingParams(temperature=temperature, max_tokens=decode_steps + 2, ignore_eos=True,
                                             seed=len(engine.requests)))
    engine.step()  # prefill
    graphs = engine.target.graphs
    compare = compare_eager and graphs is not None
    # Each mode's first two steps warm up (a graph capture, kernel compiles); the rest are timed.
    step_times: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    ahead: list[bool] = []
    # The headline mode's timed steps (graphs when on), also timed as one block.
    block = DecodeBlockClock(device, 2, decode_steps // 2 if compare else decode_steps)
    for i in range(decode_steps):
        use_graph = graphs is not None and not (compare and i >= decode_steps // 2)
        engine.target.graphs = graphs if use_graph else None
        # Synchronous steps end with their tokens read: the syncs only fence them. An async engine's
        # step is one turn of its loop, the next already queued: timed back to back, unfenced.
        block.enter(i)
        if not engine.config.async_scheduling:
            sync(device)
        t0 = time.perf_counter()
        stats = engine.step()
        if not engine.config.async_scheduling:
            sync(device)
        if i >= 2 and not (compare and decode_steps // 2 <= i < decode_steps // 2 + 2):
            step_times[use_graph].append((time.perf_counter() - t0, stats.num_decode_tokens))
            ahead.append(stats.launched_ahead)
        block.leave(i)
    engine.target.graphs = graphs
    replay_ms = replay_alone_ms(graphs) if graphs is not None and graphs.graphs else None
    drain()
    main = step_times[graphs is not None] or step_times[False]
    decode_rates = [n / dt for dt, n in main if n]
    machine = f"{platform.machine()} {torch.get_num_threads()} threads"
    if device.startswith("cuda"):
        machine = torch.cuda.get_device_name()
    step_ms = 1000 * statistics.median(dt for dt, _ in main)
    result = RuntimeBenchResult(model, device, dtype, engine.decode_attention, batch, prompt_len,
                                round(statistics.median(prefill_rates), 1), round(statistics.median(decode_rates), 1),
                                round(step_ms, 3), machine,
                                cuda_graphs="on" if graphs is not None else str(engine.target.graph_blocker),
                                compile_layers=compile_layers, fused_forward=engine.target.fused is not None)
    result.graph_replay_ms = replay_ms
    result.decode_block = block.timing([dt for dt, _ in main])
    result.async_scheduling = bool(engine.config.async_scheduling)
    result.temperature = temperature
    result.decode_gemv = engine.target.fused is not None and engine.target.fused.gemv is not None
    if engine.config.async_scheduling:
        result.launched_ahead_share = round(sum(ahead) / max(len(ahead), 1), 3)
    if graphs is not None and graphs.graphs:
        result.graph_io = all(entry[3] for entry in graphs.graphs.values())
    if compare and step_times[False]:
        result.eager_decode_step_ms = round(1000 * statistics.median(dt for dt, _ in step_times[False]), 3)
    if device.startswith("cuda"):
        from infersight.kernels.ceilings.ceiling_lookup import lookup_ceilings

        lookup = lookup_ceilings(machine, dtype, given_as=None)
        result.roofline_ceiling = lookup.bandwidth_said()
        if lookup.ceilings is not None:
            roof = roofline_step_ms(engine, batch, prompt_len + decode_steps // 2, lookup.ceilings.peak_gbps)
            result.roofline_step_ms = round(roof, 4)
            result.roofline_share = round(roof / step_ms, 4)
            if result.eager_decode_step_ms:
                result.eager_roofline_share = round(roof / result.eager_decode_step_ms, 4)
    if hf_anchor != "none" or prefill_len:
        del engine, graphs
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if prefill_len:
        result.long_prefill = bench_long_prefill(model, device, dtype, prefill_len, repeats, seed, decode_attention,
                                                 compile_layers, fused_forward)
    if hf_anchor != "none":
        _hf_anchor(result, config, ["eager"] if hf_anchor == "eager" else ["eager", "static-compile"],
                   min(decode_steps, 64))
    return result


def as_dict(result: RuntimeBenchResult) -> dict[str, object]:
    return asdict(result)
