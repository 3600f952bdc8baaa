"""A decode forward (Transformer.forward) has no host sync and can be captured in a CUDA graph.

    python3 benchmarks/forward_sync_check.py

For a small dense and a small MoE model (bf16, Triton decode attention, each MoE expert path):
one eager warm-up, then a forward under torch.cuda.set_sync_debug_mode("error") (any
device-to-host sync raises), then a CUDA graph capture, replayed on new positions and block
tables written into the same input tensors, compared with an eager forward on those inputs.
Prints one line per check and exits non-zero if any fails.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infersight.runtime.model.forward_batch import ForwardBatch  # noqa: E402
from infersight.runtime.model.model_config import ModelConfig  # noqa: E402
from infersight.runtime.model.weights import build_model  # noqa: E402

DENSE = ModelConfig("sync-dense", d_model=256, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=512, max_seq_len=1024)
MOE = ModelConfig("sync-moe", d_model=256, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=256, n_experts=8, top_k=2,
                  max_seq_len=1024)
BLOCK, BATCH, WIDTH = 16, 8, 64  # WIDTH pages per table: a graph's fixed width, far past the contexts


def make_inputs(cfg: ModelConfig, gen: torch.Generator) -> tuple[ForwardBatch, torch.Tensor, torch.Tensor]:
    pages = BATCH * WIDTH + 1
    shape = (cfg.n_layers, pages, BLOCK, cfg.n_kv_heads, cfg.head_dim)
    k = torch.randn(shape, device="cuda", generator=gen).bfloat16()
    v = torch.randn(shape, device="cuda", generator=gen).bfloat16()
    idx = torch.arange(BATCH, device="cuda")
    batch = ForwardBatch(
        input_ids=torch.zeros(BATCH, dtype=torch.long, device="cuda"),
        positions=torch.zeros(BATCH, dtype=torch.long, device="cuda"),
        slot_mapping=torch.zeros(BATCH, dtype=torch.long, device="cuda"), segments=[], decode_index=idx,
        decode_block_tables=torch.zeros(BATCH, WIDTH, dtype=torch.long, device="cuda"),
        decode_context_lens=torch.ones(BATCH, dtype=torch.long, device="cuda"), logits_index=idx.clone(),
        expert_counts=torch.zeros(cfg.n_layers, max(cfg.n_experts, 1), dtype=torch.long, device="cuda")
        if cfg.is_moe else None)
    return batch, k, v


def fill(batch: ForwardBatch, gen: torch.Generator) -> None:
    """New step inputs written in place, as a graph runner would."""
    lens = torch.randint(1, WIDTH * BLOCK // 2, (BATCH,), device="cuda", generator=gen)
    tables = torch.randperm(BATCH * WIDTH, device="cuda", generator=gen).view(BATCH, WIDTH) + 1
    pos = lens - 1
    batch.input_ids.copy_(torch.randint(0, 256, (BATCH,), device="cuda", generator=gen))
    batch.positions.copy_(pos)
    batch.decode_context_lens.copy_(lens)
    batch.decode_block_tables.copy_(tables)
    batch.slot_mapping.copy_(tables.gather(1, (pos // BLOCK).view(-1, 1)).view(-1) * BLOCK + pos % BLOCK)
    if batch.expert_counts is not None:
        batch.expert_counts.zero_()


def check(cfg: ModelConfig, path: str | None) -> list[tuple[str, bool]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    model = build_model(cfg, dtype=torch.bfloat16, device="cuda", seed=0, decode_attention="triton")
    for layer in model.layers:
        if hasattr(layer.ffn, "expert_path"):
            layer.ffn.expert_path = path
    batch, k, v = make_inputs(cfg, gen)
    name = f"{cfg.name}{'/' + path if path else ''}"
    results = []
    with torch.inference_mode():
        fill(batch, gen)
        model(batch, k, v)  # warm-up: compile, stack experts, probe grouped_mm
        torch.cuda.synchronize()
        try:
            torch.cuda.set_sync_debug_mode("error")
            model(batch, k, v)
            ok = True
        except RuntimeError as exc:
            print("   sync:", str(exc).splitlines()[0])
            ok = False
        finally:
            torch.cuda.set_sync_debug_mode(0)
        results.append((f"{name}: decode forward without host sync", ok))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            model(batch, k, v)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = model(batch, k, v)
        agree = True
        for _ in range(3):
            fill(batch, gen)
            graph.replay()
            replay_counts = None if batch.expert_counts is None else batch.expert_counts.clone()
            got = static_logits.clone()
            if batch.expert_counts is not None:
                batch.expert_counts.zero_()
            want = model(batch, k, v)
            agree &= bool(torch.equal(got, want))
            if replay_counts is not None:
                agree &= bool(torch.equal(replay_counts, batch.expert_counts))
                agree &= int(replay_counts.sum()) == cfg.n_layers * BATCH * cfg.top_k
        results.append((f"{name}: CUDA graph replay == eager (logits, expert counts) on new inputs", agree))
    return results


def main() -> int:
    results = check(DENSE, None)
    for path in (None, "grouped", "padded"):
        results += check(MOE, path)
    for name, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
