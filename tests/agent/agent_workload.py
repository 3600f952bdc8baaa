"""Shared pieces of the agent and exporter tests (imported, not a conftest): a tiny engine with probes
and a workload that exercises every stream the agent folds (tasks, prefix sharing, preemption by
swap and recompute, speculation)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


from testkit import free_port, one_torch_thread, unique_ring  # noqa: F401  (re-exported)
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.runtime import Engine, EngineConfig, ModelConfig, RequestOutput, SamplingParams, StepStats

TINY = ModelConfig("t", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, n_experts=4, top_k=2,
                   max_seq_len=128)
DRAFT = ModelConfig("d", d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32, max_seq_len=128)
MAX_TOKENS = 32
CODE = "def fibonacci(n):\n    # return the n-th number\n"   # 48 bytes + BOS: 6 full blocks of 8
JSON = '{"name": "infersight", "tags": ["a", "b"], '          # 3 full blocks with its BOS
#: (prompt, task): the first request runs alone for a few steps so its prefix blocks exist when the
#: rest arrive; the KV pool (16 blocks of 8, one max-length sequence) forces preemptions.
FIRST_WAVE = [(CODE + "a", "code")]
SECOND_WAVE = [(CODE + "bb", "code"), (JSON + '"x": 1}', "json"), (CODE + "ccc", "code"), (JSON + '"y": 2}', "json"),
               ("hi", "json")]


def make_engine(ring: str, ring_capacity: int = 1 << 16, nvtx: bool = False) -> tuple[Engine, ProbeObserver]:
    """nvtx: the engine's ranges (record_function inside captures): the flight recorder's phases need them."""
    probe = ProbeObserver(ProbeConfig(ring_name=ring, ring_capacity=ring_capacity, nvtx=nvtx))
    engine = Engine(EngineConfig(model=TINY, speculative_model=DRAFT, num_kv_blocks=16, block_size=8,
                                 # 7 CPU blocks: preempted requests are both swapped and recomputed
                                 # (with 8, once mixed steps were probed too, every one was swapped)
                                 cpu_offload_blocks=7, num_speculative_tokens=4,
                                 spec_probe_every=4), probe)  # plain probe steps: a measured speedup
    return engine, probe


@dataclass
class Workload:
    engine: Engine
    prompts: dict[int, tuple[str, str]] = field(default_factory=dict)  # request id -> (prompt, task)
    steps: list[StepStats] = field(default_factory=list)

    @property
    def outputs(self) -> list[RequestOutput]:
        return [self.engine.get_output(rid) for rid in self.prompts]

    @property
    def trace_ids(self) -> set[str]:
        """The ids the engine assigned, as the exposition writes them (32 hex digits)."""
        return {f"{self.engine.requests[rid].trace_id:032x}" for rid in self.prompts}

    def prompt_tokens(self) -> int:
        """From the prompts as added (the byte tokenizer: one token per byte, plus BOS)."""
        return sum(len(self.engine.tokenizer.encode(p)) for p, _ in self.prompts.values())


def run_workload(engine: Engine, poll: Callable[[], object] | None = None) -> Workload:
    """Code requests sample (temperature 1, seeded: drafts get accepted), json ones are greedy
    (a random draft is rejected); every request generates MAX_TOKENS tokens. `poll` runs after
    every step, as an agent polling beside the engine would."""
    w = Workload(engine)

    def add(wave: list[tuple[str, str]]) -> None:
        for prompt, task in wave:
            temp = 1.0 if task == "code" else 0.0
            rid = engine.add_request(prompt, SamplingParams(temperature=temp, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                            task=task, seed=len(w.prompts)))
            w.prompts[rid] = (prompt, task)

    def step() -> None:
        w.steps.append(engine.step())
        if poll is not None:
            poll()

    with one_torch_thread():
        add(FIRST_WAVE)
        for _ in range(3):
            step()
        add(SECOND_WAVE)
        while engine.has_unfinished():
            step()
    outs = w.outputs
    # The scenario must exercise what the tests check, or they would pass vacuously.
    assert sum(o.num_preemptions for o in outs) > 0
    assert sum(o.num_cached_tokens for o in outs) > 0
    assert sum(o.num_spec_accepted for o in outs) > 0
    assert all(len(o.token_ids) == MAX_TOKENS for o in outs)
    return w
