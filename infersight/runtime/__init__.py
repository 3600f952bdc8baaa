"""The reference inference runtime: paged KV with prefix cache, continuous batching, MoE,
FlashAttention-style kernels and exact speculative decoding."""
from infersight.runtime.config import MODEL_CONFIGS, EngineConfig, ModelConfig
from infersight.runtime.engine import Engine
from infersight.runtime.errors import InvalidRequestError, UnknownModelError, WeightsError
from infersight.runtime.llm import LLM
from infersight.runtime.observer import EngineObserver, KVBlockEvent
from infersight.runtime.outputs import RequestOutput
from infersight.runtime.sampling import SamplingParams
from infersight.runtime.stats import StepStats
from infersight.runtime.tokenizer import ByteTokenizer

__all__ = ["LLM", "SamplingParams", "Engine", "EngineConfig", "ModelConfig", "MODEL_CONFIGS",
           "EngineObserver", "KVBlockEvent", "RequestOutput", "StepStats", "ByteTokenizer",
           "InvalidRequestError", "UnknownModelError", "WeightsError"]
