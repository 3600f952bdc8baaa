"""Build a tiny Llama or Mixtral checkpoint offline, for running a real vLLM without a model hub.

Runs in vLLM's environment (it needs `transformers` and `tokenizers`, which vLLM brings):

    python -m infersight.vllm.tiny_model --out DIR [--arch llama|mixtral] [--seed 0]

The weights are random (seeded), so the text is gibberish and requests stop on `length`; what the
model is for is exercising the engine: scheduling, the KV cache, prefix caching, MoE routing. The
tokenizer is a byte-level BPE trained on a small generated corpus, wrapped as
`PreTrainedTokenizerFast` with a chat template so `/v1/chat/completions` works.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 512
# A ChatML-like template: vLLM renders chat requests with it.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    words = ("the cache block token expert request model decode prefill batch queue kernel layer "
             "def return json value key print import class self lambda for while if else").split()
    out = []
    for _ in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))))
        out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789{}[]():,.\"' =+-*/")
                           for _ in range(rng.randint(8, 40))))
    return out


def build_tokenizer(out: Path, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>", additional_special_tokens=SPECIAL[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def build_model(out: Path, arch: str, seed: int, vocab_size: int, eos_id: int, bos_id: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  bos_token_id=bos_id, eos_token_id=eos_id, tie_word_embeddings=False, torch_dtype="float32")
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))
    else:
        raise ValueError(f"unknown arch {arch!r}: llama or mixtral")
    model.save_pretrained(str(out), safe_serialization=True)


def build(out: Path, arch: str = "llama", seed: int = 0) -> Path:
    """Write config, weights and tokenizer to ``out``; returns ``out``. Idempotent for one seed."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "infersight-tiny.json"
    want = {"arch": arch, "seed": seed, "vocab_size": VOCAB_SIZE}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out
    build_tokenizer(out, seed)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    build_model(out, arch, seed, len(tok), tok.eos_token_id, tok.bos_token_id)
    stamp.write_text(json.dumps(want))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infersight.vllm.tiny_model", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--arch", choices=("llama", "mixtral"), default="llama")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        print(build(Path(args.out), args.arch, args.seed))
    except ImportError as exc:
        print(f"error: {exc.name or exc} is not installed here: run this with vLLM's python", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
