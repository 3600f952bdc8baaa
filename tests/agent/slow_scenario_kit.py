"""What the slow-request scenarios share: a Driver (a real engine with probes, its ring polled as the
agent polls it), the Outcome of judging its requests with AgentState, and the Score of one cause.

A scenario declares its victims as it adds them (request id -> the cause it builds into that
request), before anything runs: the ground truth never comes from the code under test.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from testkit import one_torch_thread, unique_ring

from infersight.agent.config import AgentConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.agent.state import AgentState
from infersight.correlate.frames import EventFrames, update_labels
from infersight.probes.config import ProbeConfig
from infersight.probes.observer import ProbeObserver
from infersight.probes.records import record_registry
from infersight.probes.ring import RingConsumer
from infersight.runtime import Engine, EngineConfig, SamplingParams


def tokens(n: int, first: int = 0) -> list[int]:
    """n prompt token ids (byte values), starting at `first` so prompts differ from their first block
    (no prefix-cache hit between two prompts of different `first` below 250)."""
    return [(first + i) % 250 + 1 for i in range(n)]


@dataclass(frozen=True)
class Score:
    """How the agent did on one cause C of one scenario.

    victims: requests the scenario built to be slow because of C (declared before the run).
    flagged: requests the agent flagged slow with cause C. hits: those of them that are victims of C.
    precision = hits / flagged (of the requests labelled C, the share truly made slow by C; NaN when
    none is labelled C). recall = hits / victims (of the requests made slow by C, the share the agent
    flagged and labelled C)."""

    cause: str
    victims: int
    flagged: int
    hits: int

    @property
    def precision(self) -> float:
        return self.hits / self.flagged if self.flagged else math.nan

    @property
    def recall(self) -> float:
        return self.hits / self.victims if self.victims else math.nan


@dataclass
class Outcome:
    """What the agent flagged (request id -> slow_cause, and its detail), under which rule, and what
    the scenario built (victims: request id -> cause)."""

    flagged: dict[int, str]
    details: dict[int, str]
    victims: dict[int, str]
    requests: int
    rule: str
    overrides: dict[str, object]  # the AgentConfig fields given for the rule; {}: the agent's defaults
    #: each victim's judged metric over the normal requests' median, by the engine's timestamps:
    #: how slow the scenario made it (filled by the scenario, which knows its normal requests)
    slowdown: dict[int, float] = field(default_factory=dict)

    def score(self, cause: str) -> Score:
        labelled = {r for r, c in self.flagged.items() if c == cause}
        built = {r for r, c in self.victims.items() if c == cause}
        return Score(cause, len(built), len(labelled), len(labelled & built))

    def causes(self) -> list[str]:
        """The causes the scenario built, in the order of their first victim."""
        return list(dict.fromkeys(self.victims.values()))

    def others(self) -> dict[int, str]:
        """Flagged requests the scenario did not make slow (jitter of a loaded host, or a mistake)."""
        return {r: c for r, c in self.flagged.items() if r not in self.victims}

    def explain(self) -> dict[str, object]:
        """Everything a failure message needs: where the labels and the victims differ."""
        missed = {r: (c, self.flagged.get(r), self.details.get(r)) for r, c in self.victims.items()
                  if self.flagged.get(r) != c}
        return {"rule": self.rule, "missed or mislabelled (built, flagged, detail)": missed,
                "others flagged": {r: (c, self.details[r]) for r, c in self.others().items()}}


@dataclass
class Driver:
    """An engine with probes; the ring is read every `every` steps, one poll each."""

    config: EngineConfig
    every: int = 8
    ring: str = field(default_factory=lambda: unique_ring("slow"))

    def __post_init__(self) -> None:
        self.probe = ProbeObserver(ProbeConfig(ring_name=self.ring, nvtx=False, ring_capacity=1 << 18))
        self.consumer = RingConsumer.attach(self.ring, record_registry())
        self.engine = Engine(self.config, self.probe)
        self.polls: list[dict[int, np.ndarray]] = []  # each poll's records, decoded into frames by judge()
        self.steps = 0
        self.victims: dict[int, str] = {}

    def add(self, prompt: str | list[int], max_tokens: int, victim_of: str | None = None, **params: object) -> int:
        """Add a request (greedy, exactly max_tokens tokens); victim_of: the cause the scenario builds into it."""
        rid = self.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                             **{"temperature": 0.0, **params}))
        if victim_of is not None:
            self.victims[rid] = victim_of
        return rid

    def run(self, steps: int | None = None) -> None:
        """`steps` steps, or until idle."""
        with one_torch_thread():
            while self.engine.has_unfinished() and (steps is None or steps > 0):
                self.engine.step()
                self.steps += 1
                steps = None if steps is None else steps - 1
                if self.steps % self.every == 0:
                    self.poll()

    def normal(self, n: int, max_tokens: int = 16, at_once: int = 2,
               prompt: Callable[[int], str | list[int]] = lambda rid: f"a normal request {rid}") -> list[int]:
        """n normal requests (prompt(request id) each), `at_once` arriving together, each group run until idle."""
        ids = []
        for i in range(0, n, at_once):
            ids += [self.add(prompt(self.engine.next_request_id), max_tokens) for _ in range(min(at_once, n - i))]
            self.run()
        return ids

    def poll(self) -> None:
        # Only the ring read here: the requests in flight wait for whatever runs between two steps,
        # and decoding frames (ms) would add to their latency what the agent's own process takes.
        self.polls.append(self.consumer.read())

    def judge(self, first: EventFrames | None = None, last: EventFrames | None = None, **rule: object) -> Outcome:
        """Feed the polls to an AgentState with this slow rule (SlowRequestConfig fields; none: the agent's
        defaults). first, last: frames that join the first and the last poll (what `infersight serve`
        writes to its own ring: SERVED at arrival, NETWORK once the last byte is out)."""
        self.poll()
        assert self.consumer.dropped_seen == 0
        self.consumer.close()
        self.probe.close()
        state = AgentState(AgentConfig(rings=[self.ring], slow=SlowRequestConfig(**rule)))  # type: ignore[arg-type]
        labels: dict[int, str] = {}
        for i, records in enumerate(self.polls):
            labels = update_labels(labels, records)
            frames = EventFrames.from_records(records, labels)
            for extra, at in ((first, 0), (last, len(self.polls) - 1)):
                if extra is not None and i == at:
                    frames = frames.concat(extra)
            state.ingest(frames)
        assert len(state.finished) == self.engine.next_request_id
        rows = [r for r in state.finished if r["slow_cause"]]
        return Outcome({int(r["request_id"]): str(r["slow_cause"]) for r in rows},
                       {int(r["request_id"]): str(r["slow_detail"]) for r in rows}, dict(self.victims),
                       self.engine.next_request_id, state.slow_rule.describe(), dict(rule))


def score_table(outcomes: dict[str, Outcome]) -> str:
    """One line per (scenario, built cause): victims, flagged with that cause, precision, recall, the
    other requests flagged (with any cause), the least slowdown among the victims, the rule."""
    lines = ["| scenario | cause | requests | victims | flagged | precision | recall | others flagged "
             "| least victim slowdown | rule |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, o in outcomes.items():
        for cause in o.causes():
            s = o.score(cause)
            least = min((o.slowdown[r] for r, c in o.victims.items() if c == cause and r in o.slowdown),
                        default=math.nan)
            rule = o.rule + ("" if o.overrides else " (the agent's defaults)")
            lines.append(f"| {name} | {cause} | {o.requests} | {s.victims} | {s.flagged} | {s.precision:.3f} | "
                         f"{s.recall:.3f} | {len(o.others())} | {least:.1f}x | {rule} |")
    return "\n".join(lines)
