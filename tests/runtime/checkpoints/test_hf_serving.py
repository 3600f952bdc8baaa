"""`infersight serve` on a Hugging Face checkpoint: a chat request is the checkpoint's chat template
tokenized, its greedy completion is transformers', and the streamed pieces (tokenizers'
DecodeStream) add up to the same text."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch

from hf_tiny_checkpoints import MAX_TOKENS, needs_transformers
from testkit import one_torch_thread

pytestmark = needs_transformers

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello world! How are you?"}]


def _transformers_chat(directory: Path) -> tuple[int, str]:
    """(prompt tokens, greedy completion text) by transformers alone."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return ids.shape[1], tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


async def _chat(app: object, stream: bool) -> tuple[dict, str]:
    import httpx

    body = {"model": "tiny-qwen3", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve.test",
                                 timeout=120) as client:
        r = await client.post("/v1/chat/completions", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 200, r.text
    if not stream:
        data = r.json()
        return data["usage"], data["choices"][0]["message"]["content"]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return next(c["usage"] for c in chunks if c.get("usage")), text


def test_chat_completion_streamed_and_not_is_transformers_greedy_chat(hf_checkpoints: dict[str, Path]) -> None:
    from infersight.runtime import Engine, EngineConfig
    from infersight.serve.app import build_app
    from infersight.serve.config import ServeConfig
    from infersight.serve.engine_loop import EngineLoop

    directory = hf_checkpoints["qwen3"]
    prompt_tokens, want = _transformers_chat(directory)
    with one_torch_thread():
        engine = Engine(EngineConfig(model=str(directory), num_kv_blocks=32, max_model_len=128))
        loop = EngineLoop(engine, None)
        loop.start()
        try:
            app = build_app(loop, ServeConfig(model_name="tiny-qwen3"))
            for stream in (False, True):
                usage, text = asyncio.run(_chat(app, stream))
                assert usage["prompt_tokens"] == prompt_tokens
                assert text == want, f"stream={stream}"
        finally:
            loop.stop()
