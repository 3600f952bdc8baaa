"""Training path: forward_train matches the paged inference forward, the MoE aux loss, a CPU
smoke run that learns, and saved weights that load back into the engine unchanged."""
from __future__ import annotations

import json

import pytest
import torch

from infersight.runtime import LLM, ByteTokenizer, ModelConfig, SamplingParams
from infersight.runtime.model.forward_batch import ForwardBatch, Segment
from infersight.runtime.model.moe import MoEFFN
from infersight.runtime.ranges import RangeMarker, layer_range_names
from infersight.runtime.model.weights import build_model
from infersight.training.corpus import build_corpus
from infersight.training.train import IGNORE, WindowSampler, init_model, lm_loss, save, train

MOE = ModelConfig("train-moe", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=16, n_experts=4,
                  top_k=2, shared_expert=True, max_seq_len=128)
DENSE = ModelConfig("train-dense", d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, ffn_dim=48, max_seq_len=128)
tok = ByteTokenizer()


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(seed=0, max_bytes_per_task=20_000)


def _prefill_logits(model, tokens: list[int], block_size: int = 8) -> torch.Tensor:
    """Logits at every position from the inference forward: one prefill over a paged KV cache whose
    blocks are deliberately out of order."""
    cfg = model.cfg
    t = len(tokens)
    n_blocks = -(-t // block_size)
    table = torch.arange(n_blocks).flip(0) + 1  # blocks n..1, block 0 unused
    shape = (cfg.n_layers, n_blocks + 1, block_size, cfg.n_kv_heads, cfg.head_dim)
    k_caches, v_caches = torch.zeros(shape), torch.zeros(shape)
    pos = torch.arange(t)
    empty = torch.empty(0, dtype=torch.long)
    batch = ForwardBatch(input_ids=torch.tensor(tokens), positions=pos,
                         slot_mapping=table[pos // block_size] * block_size + pos % block_size,
                         segments=[Segment(0, t, t, table)], decode_index=empty,
                         decode_block_tables=torch.zeros(0, 0, dtype=torch.long), decode_context_lens=empty,
                         logits_index=pos)
    with torch.inference_mode():
        return model(batch, k_caches, v_caches)


@pytest.mark.parametrize("cfg", [MOE, DENSE], ids=lambda c: c.name)
@pytest.mark.parametrize("backend", ["flash", "sdpa", "naive"])
def test_forward_train_equals_inference_forward(cfg, backend):
    model = build_model(cfg, dtype=torch.float32, device="cpu", seed=5, attention_backend=backend)
    tokens = tok.encode("def forward(self, x):\n    return x * 2  # prefill of a few blocks")
    want = _prefill_logits(model, tokens)
    with torch.no_grad():
        got, aux = model.forward_train(torch.tensor([tokens, tokens]))
    assert got.shape == (2, len(tokens), cfg.vocab_size)
    assert torch.allclose(got[0], want, atol=1e-4) and torch.allclose(got[1], want, atol=1e-4)
    assert (got[0, -1] - want[-1]).abs().max() < 1e-4  # the last position: what generation samples from
    assert aux.item() > 0 if cfg.is_moe else aux.item() == 0


def test_moe_forward_train_output_and_load_balancing_loss():
    torch.manual_seed(0)
    moe = MoEFFN(MOE, RangeMarker(), layer_range_names(0))
    x = torch.randn(3, 5, MOE.d_model)
    out, aux = moe.forward_train(x)
    with torch.no_grad():
        assert torch.allclose(out, moe(x.reshape(15, -1)).view(3, 5, -1), atol=1e-6)
    probs = torch.softmax(moe.router(x.reshape(15, -1)), -1)
    ids = probs.topk(MOE.top_k, -1).indices
    share = torch.stack([(ids == e).sum() for e in range(MOE.n_experts)]).float() / ids.numel()
    assert torch.allclose(aux, MOE.n_experts * (share * probs.mean(0)).sum(), atol=1e-6)
    aux.backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0


def test_window_sampler_rows(corpus):
    sampler = WindowSampler(corpus, seq_len=64, seed=0)
    inputs, targets = sampler.batch(8, step=0)
    assert inputs.shape == targets.shape == (8, 64)
    assert (inputs[:, 0] == tok.bos_id).all()
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    assert ((targets >= 0) & (targets < 258) | (targets == IGNORE)).all()
    assert not (inputs[:, 1:] == 0).any()  # the document separator is read as EOS
    again = WindowSampler(corpus, seq_len=64, seed=0).batch(8, step=0)
    assert torch.equal(again[0], inputs)


def _greedy(model, prompt: str, n: int) -> list[int]:
    ids = tok.encode(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model.forward_train(torch.tensor([ids]))[0][0, -1].argmax())
            ids.append(nxt)
            out.append(nxt)
    return out


def test_cpu_smoke_training_learns_and_saves(corpus, tmp_path):
    torch.manual_seed(123)
    fixed_in, fixed_tgt = WindowSampler(corpus, seq_len=32, seed=99).batch(8)
    with torch.no_grad():
        before = lm_loss(init_model(MOE, "cpu", seed=7).forward_train(fixed_in)[0], fixed_tgt).item()
    result = train(MOE, corpus, steps=5, device="cpu", batch_size=8, seq_len=32, lr=1e-2, seed=7,
                   log_every=1, eval_windows=2, log=None)
    with torch.no_grad():
        after = lm_loss(result.model.forward_train(fixed_in)[0], fixed_tgt).item()
    assert after < before
    assert len(result.history) == 5 and all(h["loss"] == h["loss"] for h in result.history)  # finite, not NaN
    assert result.tokens_seen > 0 and set(result.task_loss) == {"code", "json", "chat", "creative"}
    assert len(result.expert_load) == MOE.n_layers
    assert all(abs(sum(layer) - 1) < 1e-5 for layer in result.expert_load)

    # float32 file: the engine, loading it, generates exactly what the in-memory model does.
    path = save(result, tmp_path / "f32", dtype="float32")
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompt = "You emit one JSON object per line, valid and compact.\n{"
    from_file = LLM(MOE, weights=path).generate([prompt], greedy)[0].token_ids
    assert from_file == _greedy(result.model, prompt, 10)
    info = json.loads((tmp_path / "f32" / f"{MOE.name}.train.json").read_text())
    assert info["steps"] == 5 and info["weights"]["dtype"] == "float32" and "model" not in info

    # float16 file (the default): loads back as the in-memory weights rounded to float16.
    path16 = save(result, tmp_path / "f16")
    assert path16.stat().st_size < path.stat().st_size * 0.6
    loaded = build_model(MOE, dtype=torch.float32, device="cpu", seed=0, weights=path16)
    mem = dict(result.model.named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, mem[name].detach().half().float()), name
    assert LLM(MOE, weights=path16).generate([prompt], greedy)[0].token_ids == _greedy(loaded, prompt, 10)


def test_dense_training_runs_without_aux(corpus):
    result = train(DENSE, corpus, steps=2, device="cpu", batch_size=4, seq_len=16, lr=1e-3, seed=0,
                   log_every=1, eval_windows=1, log=None)
    assert result.expert_load == [] and all(h["aux"] == 0 for h in result.history)


def test_cli_trains_target_and_draft_and_scores_speculation(tmp_path, capsys):
    from infersight.training.__main__ import main

    corpus_dir, out = tmp_path / "corpus", tmp_path / "models"
    assert main(["--build-corpus", str(corpus_dir), "--max-bytes-per-task", "20000"]) == 0
    assert (corpus_dir / "manifest.json").is_file()
    threads = torch.get_num_threads()
    try:  # one thread: the engine's many small CPU ops crawl when threads are oversubscribed
        assert main(["--model", "tiny-moe", "tiny-draft", "--steps", "2", "--batch-size", "4", "--seq-len", "32",
                     "--device", "cpu", "--corpus", str(corpus_dir), "--out", str(out), "--log-every", "1",
                     "--spec-requests", "1", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "speculative acceptance" in printed and "tiny-draft top-1 agreement" in printed
    info = json.loads((out / "tiny-moe.train.json").read_text())
    rates = info["extra"]["workload_spec_acceptance"]["tiny-draft"]
    assert "all" in rates and all(0 <= v <= 1 for v in rates.values())
    assert (out / "tiny-draft.safetensors").stat().st_size < (out / "tiny-moe.safetensors").stat().st_size < 10e6
