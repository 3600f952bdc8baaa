"""Tokenizer, RoPE, MoE routing and weights round trip, each against an independent reference."""
from __future__ import annotations

import torch

from infersight.runtime import LLM, ByteTokenizer, ModelConfig, SamplingParams
from infersight.runtime.model.layers import RotaryEmbedding
from infersight.runtime.model.moe import MoEFFN, route
from infersight.runtime.ranges import RangeMarker, layer_range_names
from infersight.runtime.model.weights import build_model, save_safetensors

TINY = ModelConfig("t-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, n_experts=4, top_k=2,
                   shared_expert=True, max_seq_len=64)


def test_tokenizer_round_trip_and_specials():
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids == [tok.bos_id, 104, 195, 169, 108, 108, 111]
    assert tok.decode(ids + [tok.eos_id]) == "héllo"
    assert tok.decode([195]) == "\ufffd"  # half a character never raises


def test_rope_rotates_pairs_by_position_angle():
    rope = RotaryEmbedding(head_dim=4, max_positions=8, theta=10000.0)
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    out = rope(x, torch.tensor([3]))[0, 0]
    # rotate-half pairs (x0, x2) and (x1, x3); frequencies 1 and 1/100
    import math
    a0, a1 = 3 * 1.0, 3 * 0.01
    want = [1 * math.cos(a0) - 3 * math.sin(a0), 2 * math.cos(a1) - 4 * math.sin(a1),
            3 * math.cos(a0) + 1 * math.sin(a0), 4 * math.cos(a1) + 2 * math.sin(a1)]
    assert torch.allclose(out, torch.tensor(want), atol=1e-6)


def test_route_renormalises_topk():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    weights, ids = route(logits, 2)
    e = [torch.exp(torch.tensor(v)).item() for v in (2.0, 1.0)]
    assert ids.tolist() == [[0, 1]]
    assert torch.allclose(weights, torch.tensor([[e[0] / sum(e), e[1] / sum(e)]]))


def test_moe_equals_a_per_token_loop():
    torch.manual_seed(0)
    moe = MoEFFN(TINY, RangeMarker(), layer_range_names(0))
    x = torch.randn(7, TINY.d_model)
    with torch.no_grad():
        got = moe(x)
        want = []
        for t in range(7):
            probs = torch.softmax(moe.router(x[t]), -1)
            top = torch.topk(probs, TINY.top_k)
            w = top.values / top.values.sum()
            y = sum(w[j] * moe.experts[int(top.indices[j])](x[t]) for j in range(TINY.top_k))
            want.append(y + moe.shared(x[t]))
    assert torch.allclose(got, torch.stack(want), atol=1e-5)


def test_random_init_is_deterministic_by_seed():
    a = build_model(TINY, dtype=torch.float32, device="cpu", seed=1)
    b = build_model(TINY, dtype=torch.float32, device="cpu", seed=1)
    c = build_model(TINY, dtype=torch.float32, device="cpu", seed=2)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)


def test_safetensors_round_trip_gives_identical_generations(tmp_path):
    path = tmp_path / "w.safetensors"
    save_safetensors(build_model(TINY, dtype=torch.float32, device="cpu", seed=9), path)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    from_seed = LLM(TINY, seed=9).generate(["abc", "hello"], params)
    from_file = LLM(TINY, seed=123, weights=path).generate(["abc", "hello"], params)
    assert [o.token_ids for o in from_seed] == [o.token_ids for o in from_file]
