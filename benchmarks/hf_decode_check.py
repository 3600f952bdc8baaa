"""A Llama-architecture Hugging Face checkpoint of llama-1b-shape's dimensions (random bfloat16
weights, written by transformers' save_pretrained, with a byte-level BPE tokenizer) against the named
`llama-1b-shape` config: `bench runtime` decode steps at batch 1 and 32 for both, in one run.

    python3 benchmarks/hf_decode_check.py --device cuda [--out DIR]
Prints each `bench runtime` result line and a last JSON line with the step-time ratios (checkpoint /
named config), all measured. The checkpoint goes to a temporary directory unless --out names one.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from infersight.runtime.model.model_config import MODEL_CONFIGS


def write_checkpoint(out: Path) -> None:
    """transformers writes the checkpoint and its tokenizer: an independent writer for our loader."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    named = MODEL_CONFIGS["llama-1b-shape"]
    cfg = LlamaConfig(vocab_size=named.vocab_size, hidden_size=named.d_model, intermediate_size=named.ffn_dim,
                      num_hidden_layers=named.n_layers, num_attention_heads=named.n_heads,
                      num_key_value_heads=named.n_kv_heads, max_position_embeddings=named.max_seq_len,
                      rope_theta=named.rope_theta, tie_word_embeddings=False, bos_token_id=256, eos_token_id=257,
                      torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # 256 byte symbols and 3 specials: the named config's vocabulary size exactly
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=named.vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["a"], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(out)


def bench(model: str, batch: int, device: str) -> dict:
    cmd = [sys.executable, "-m", "infersight", "bench", "runtime", "--model", model, "--device", device,
           "--dtype", "bfloat16", "--json", "--prompt-len", "512", "--batch", str(batch), "--decode-steps", "130",
           "--async-scheduling"]
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(line, flush=True)
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="llama-1b-shape-hf-"))
    write_checkpoint(out)
    ratios = {}
    for batch in (1, 32):
        hf, named = bench(str(out), batch, args.device), bench("llama-1b-shape", batch, args.device)
        ratios[f"batch_{batch}"] = {"hf_step_ms": hf["decode_step_ms"], "named_step_ms": named["decode_step_ms"],
                                    "ratio": round(hf["decode_step_ms"] / named["decode_step_ms"], 4)}
    print(json.dumps({"measured": True, "checkpoint": str(out), "decode_step_ms": ratios}))


if __name__ == "__main__":
    main()
