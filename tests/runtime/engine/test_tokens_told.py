"""How the engine tells its observer of emitted tokens: one on_tokens_emitted_many a step for the
requests that go on, on_tokens_emitted before the FINISHED of a request its tokens end, and every
token told exactly once (checked against the requests' own outputs, and against an observer that
listens only to on_tokens_emitted)."""
from __future__ import annotations

import pytest

from infersight.runtime import Engine, EngineConfig, EngineObserver, ModelConfig, SamplingParams

MODEL = ModelConfig("told-tiny", d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=64)
MAX_TOKENS = {0: 1, 1: 4, 2: 7, 3: 7}  # request 0 ends with its first token; 2 and 3 share their last step


class Calls(EngineObserver):
    def __init__(self) -> None:
        self.log: list[tuple] = []

    def on_step_begin(self, step_id: int, t_ns: int) -> None:
        self.log.append(("step", step_id))

    def on_first_token(self, request_id: int, t_ns: int) -> None:
        self.log.append(("first", request_id, t_ns))

    def on_tokens_emitted(self, request_id: int, t_ns: int, num_tokens: int) -> None:
        self.log.append(("one", request_id, t_ns, num_tokens))

    def on_tokens_emitted_many(self, request_ids: list[int], t_ns: int, num_tokens: list[int]) -> None:
        self.log.append(("many", tuple(request_ids), t_ns, tuple(num_tokens)))

    def on_request_finished(self, request_id: int, t_ns: int, reason: str, num_output_tokens: int) -> None:
        self.log.append(("finished", request_id, num_output_tokens))


class OnlyOne(EngineObserver):
    """Overrides on_tokens_emitted alone: handed each emission of a batch one call at a time."""

    def __init__(self) -> None:
        self.told: dict[int, int] = {}

    def on_tokens_emitted(self, request_id: int, t_ns: int, num_tokens: int) -> None:
        self.told[request_id] = self.told.get(request_id, 0) + num_tokens


def _run(observer: EngineObserver, async_scheduling: bool = False) -> Engine:
    engine = Engine(EngineConfig(model=MODEL, block_size=4, num_kv_blocks=32, seed=1,
                                 async_scheduling=async_scheduling), observer)
    for rid, n in MAX_TOKENS.items():
        assert engine.add_request([256, 10 + rid, 11, 12], SamplingParams(temperature=0, ignore_eos=True,
                                                                          max_tokens=n)) == rid
    while engine.has_unfinished():
        engine.step()
    assert {rid: len(r.output_token_ids) for rid, r in engine.requests.items()} == MAX_TOKENS
    return engine


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_each_token_told_once_finishing_ones_before_their_finish(async_scheduling: bool) -> None:
    calls = Calls()
    _run(calls, async_scheduling)
    told = {rid: 0 for rid in MAX_TOKENS}
    finished: set[int] = set()
    for entry in calls.log:
        if entry[0] == "one":
            told[entry[1]] += entry[3]
        elif entry[0] == "many":
            for rid, n in zip(entry[1], entry[3]):
                assert rid not in finished
                told[rid] += n
        elif entry[0] == "finished":
            assert entry[2] == told[entry[1]] == MAX_TOKENS[entry[1]]  # all its tokens told before it
            finished.add(entry[1])
    assert told == MAX_TOKENS and finished == set(MAX_TOKENS)
    steps = [i for i, e in enumerate(calls.log) if e[0] == "step"] + [len(calls.log)]
    for a, b in zip(steps, steps[1:]):
        step = calls.log[a:b]
        many = [e for e in step if e[0] == "many"]
        assert len(many) <= 1  # one call a step
        ones = [e[1] for e in step if e[0] == "one"]
        ended = [e[1] for e in step if e[0] == "finished"]
        assert ones == ended  # told alone exactly when its tokens end it, just before its FINISHED
        for e in step:
            if e[0] == "one":
                assert step[step.index(e) + 1][0] == "finished" and step[step.index(e) + 1][1] == e[1]
        if many:  # the requests that went on, none of the ending ones, after any FIRST_TOKEN's time
            assert not set(many[0][1]) & set(ended)
            firsts = [e[2] for e in step if e[0] == "first"]
            assert all(t <= many[0][2] for t in firsts)
    first = [e for e in calls.log if e[0] == "first"]
    assert sorted(e[1] for e in first) == sorted(MAX_TOKENS)  # request 0's first token ends it: told alone


def test_an_observer_of_single_emissions_hears_every_token() -> None:
    only = OnlyOne()
    _run(only)
    assert only.told == MAX_TOKENS


def test_the_base_ignores_a_batch_and_a_single_emission_listener_hears_each() -> None:
    """Off (the base class) does nothing with a batch, no per-request loop; a subclass that listens only
    to single emissions is handed each one; one that takes the batch keeps its own method."""
    EngineObserver().on_tokens_emitted_many([1, 2], 5, [1, 1])
    assert EngineObserver.on_tokens_emitted_many is not EngineObserver._each_emitted
    only = OnlyOne()
    only.on_tokens_emitted_many([1, 2, 1], 5, [1, 2, 3])
    assert only.told == {1: 4, 2: 2}
    assert Calls.on_tokens_emitted_many is not EngineObserver._each_emitted
