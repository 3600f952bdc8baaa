"""The reference inference runtime: paged KV with prefix cache, continuous batching, MoE,
FlashAttention-style kernels and exact speculative decoding.

Rooms: engine/ (the step loop, scheduler, requests, sampling, the LLM API), model/ (shapes, the
transformer and its kernels, weights), runner/ (a model run on a batch, CUDA graphs), kv/ (block pool
and block tables), speculative/ (verification, the draft's turn, probe steps), checkpoints/ (Hugging
Face directories), parallel/ (expert parallelism). At the top: what every room and the readers
outside share (config, errors, observer, ranges, stats, tokenizer).

Names are loaded on first use (PEP 562), so a consumer that only needs a torch-free submodule
(the agent reads `infersight.runtime.observer` for event codes) does not pay for importing torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "engine.llm", "SamplingParams": "engine.sampling", "Engine": "engine.engine", "EngineConfig": "config",
    "ModelConfig": "config", "MODEL_CONFIGS": "config", "EngineObserver": "observer", "KVBlockEvent": "observer",
    "RequestOutput": "engine.outputs", "StepStats": "stats", "ByteTokenizer": "tokenizer",
    "InvalidRequestError": "errors", "UnknownModelError": "errors", "WeightsError": "errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from infersight.runtime.config import MODEL_CONFIGS, EngineConfig, ModelConfig
    from infersight.runtime.engine.engine import Engine
    from infersight.runtime.errors import InvalidRequestError, UnknownModelError, WeightsError
    from infersight.runtime.engine.llm import LLM
    from infersight.runtime.observer import EngineObserver, KVBlockEvent
    from infersight.runtime.engine.outputs import RequestOutput
    from infersight.runtime.engine.sampling import SamplingParams
    from infersight.runtime.stats import StepStats
    from infersight.runtime.tokenizer import ByteTokenizer


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'infersight.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"infersight.runtime.{module}"), name)
    globals()[name] = value
    return value
