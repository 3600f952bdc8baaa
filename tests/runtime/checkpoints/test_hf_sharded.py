"""A sharded checkpoint (model.safetensors.index.json) loads as the single file does: every shard
read, one tensor at a time, and the greedy tokens are transformers' on the same directory."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from hf_tiny_checkpoints import MAX_TOKENS, PROMPTS, needs_transformers, transformers_greedy

pytestmark = needs_transformers


def test_the_index_names_several_shards_and_the_reader_takes_each_tensor_once(sharded_checkpoint: Path) -> None:
    from infersight.runtime.checkpoints.shard_reader import ShardReader

    index = json.loads((sharded_checkpoint / "model.safetensors.index.json").read_text())
    assert not (sharded_checkpoint / "model.safetensors").exists()
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    reader = ShardReader(sharded_checkpoint)
    assert [p.name for p in reader.files] == shards
    names = [name for name, _ in reader.tensors()]
    assert sorted(names) == sorted(index["weight_map"]) and len(names) == len(set(names))
    assert set(reader.shapes()) == set(index["weight_map"])


def test_greedy_tokens_from_shards_are_those_of_transformers(sharded_checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from infersight.runtime import LLM, SamplingParams

    model = AutoModelForCausalLM.from_pretrained(sharded_checkpoint, dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(sharded_checkpoint)
    llm = LLM(model=str(sharded_checkpoint), num_kv_blocks=64, max_model_len=256)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert [o.token_ids for o in outs] == [transformers_greedy(model, tokenizer, p)[1] for p in PROMPTS]
