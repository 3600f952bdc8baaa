"""CUDA correctness checks for the reference runtime (run on the GPU machine; CI has no GPU).

Prints one line per check and exits non-zero if any fails:
- paged split-KV decode and tiled flash attention equal the naive reference on CUDA (fp32);
- greedy tokens identical with speculation on/off and prefix caching on/off, on CUDA;
"""
from __future__ import annotations

import sys

import torch

from infersight.runtime import LLM, ModelConfig, SamplingParams
from infersight.runtime.model.attention import flash_attention, gather_kv, naive_attention, paged_decode_attention

SMALL = ModelConfig("gpu-check-moe", d_model=128, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=256,
                    n_experts=8, top_k=2, max_seq_len=512)
DRAFT = ModelConfig("gpu-check-draft", d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=512)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def main() -> int:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    results = []
    q = torch.randn(70, 8, 64, device=dev, generator=g)
    k = torch.randn(100, 2, 64, device=dev, generator=g)
    v = torch.randn(100, 2, 64, device=dev, generator=g)
    results.append(("flash == naive (cuda fp32)",
                    rel_err(flash_attention(q, k, v, q_offset=30), naive_attention(q, k, v, q_offset=30)) <= 1e-5))
    kc = torch.randn(64, 16, 2, 64, device=dev, generator=g)
    vc = torch.randn(64, 16, 2, 64, device=dev, generator=g)
    tables = torch.randperm(64, device=dev).view(4, 16)
    lens = torch.tensor([1, 17, 100, 256], device=dev)
    qd = torch.randn(4, 8, 64, device=dev, generator=g)
    out = paged_decode_attention(qd, kc, vc, tables, lens)
    ok = all(rel_err(out[b:b + 1], naive_attention(qd[b:b + 1], *gather_kv(kc, vc, tables[b], int(lens[b])),
                                                      causal=False)) <= 1e-5 for b in range(4))
    results.append(("paged decode == naive (cuda fp32)", ok))
    from infersight.runtime.model.triton_decode import triton_decode_problem, triton_paged_decode_attention
    problem = triton_decode_problem(dev)
    results.append((f"triton decode kernel runs ({problem or 'ok'})", problem is None))
    if problem is None:
        out = triton_paged_decode_attention(qd, kc, vc, tables, lens)
        ok = all(rel_err(out[b:b + 1], naive_attention(qd[b:b + 1], *gather_kv(kc, vc, tables[b], int(lens[b])),
                                                          causal=False)) <= 1e-5 for b in range(4))
        results.append(("triton paged decode == naive (cuda fp32)", ok))
        ob = triton_paged_decode_attention(qd.bfloat16(), kc.bfloat16(), vc.bfloat16(), tables, lens)
        ok = all(rel_err(ob[b:b + 1].float(), naive_attention(
            qd[b:b + 1].bfloat16().float(), *(t.bfloat16().float() for t in gather_kv(kc, vc, tables[b], int(lens[b]))),
            causal=False)) <= 2 ** -8 for b in range(4))
        results.append(("triton paged decode == naive (cuda bf16 in, fp32 math)", ok))

    prompts = ["The cache holds ", "def main():\n    ", '{"k": [1, 2', "The cache holds the keys"] * 3
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    def run(**kw: object) -> list[list[int]]:
        return [o.token_ids for o in LLM(SMALL, seed=1, **kw).generate(prompts, params)]  # type: ignore[arg-type]

    base = run(device=dev)
    results.append(("greedy: speculation on == off (cuda)", run(device=dev, speculative_model=DRAFT) == base))
    results.append(("greedy: prefix caching off == on (cuda)", run(device=dev, enable_prefix_caching=False) == base))
    results.append(("greedy: sdpa == flash backend (cuda)", run(device=dev, attention_backend="flash") == base))
    results.append(("greedy: triton == torch decode kernel (cuda)",
                    run(device=dev, decode_attention="triton") == run(device=dev, decode_attention="torch")))
    for name, ok in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
