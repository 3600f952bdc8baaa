"""The offline API in the style of vLLM: LLM(...).generate(prompts, SamplingParams(...))."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from infersight.runtime.config import EngineConfig, ModelConfig
from infersight.runtime.engine.engine import Engine
from infersight.runtime.observer import EngineObserver
from infersight.runtime.engine.outputs import RequestOutput
from infersight.runtime.engine.sampling import SamplingParams


class LLM:
    """A batch generator over one Engine. Extra keyword arguments go to EngineConfig.

    max_model_len: the longest prompt + output served (None: the model's max_seq_len); a smaller
    one lets a small num_kv_blocks be used. enforce_eager: no CUDA graphs for decode steps."""

    def __init__(self, model: str | ModelConfig = "tiny-moe", *, device: str = "cpu", seed: int = 0,
                 speculative_model: str | ModelConfig | None = None, num_speculative_tokens: int = 4,
                 enable_prefix_caching: bool = True, num_kv_blocks: int | None = None,
                 cpu_offload_blocks: int = 0, weights: str | Path | None = None,
                 max_model_len: int | None = None, enforce_eager: bool = False,
                 observer: EngineObserver | None = None, **engine_kwargs: object) -> None:
        config = EngineConfig(model=model, device=device, seed=seed, speculative_model=speculative_model,
                              num_speculative_tokens=num_speculative_tokens,
                              enable_prefix_caching=enable_prefix_caching, num_kv_blocks=num_kv_blocks,
                              cpu_offload_blocks=cpu_offload_blocks, weights=weights,
                              max_model_len=max_model_len, enforce_eager=enforce_eager,
                              **engine_kwargs)  # type: ignore[arg-type]
        self.engine = Engine(config, observer)

    def generate(self, prompts: str | Sequence[str] | Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                ids.append(self.engine.add_request(prompt, p))
        except ValueError:
            for rid in ids:  # all or nothing: a bad prompt leaves no half-submitted batch behind
                self.engine.abort_request(rid)
                self.engine.release(rid)
            raise
        wanted = set(ids)
        while wanted & {r for r, req in self.engine.requests.items() if not req.is_finished}:
            self.engine.step()
        return [self.engine.release(rid) for rid in ids]
