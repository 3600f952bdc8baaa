"""The agent's side of tracing, in-process: AgentState + TracingHook exporting to memory, fed from a
serve_fixtures.Harness ring exactly as Agent.poll_once feeds them."""
from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_fixtures import MODEL, Harness

from infersight.agent.config import AgentConfig
from infersight.agent.slow.config import SlowRequestConfig
from infersight.exporters.exposition_config import ExpositionConfig
from infersight.agent.state import AgentState
from infersight.tracing.exporter import SpanPipeline
from infersight.tracing.hook import TracingHook


@dataclass
class AgentSide:
    ratio: float = 1.0
    export_content: bool = False
    min_requests_for_p99: int = 20
    memory: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)

    def __post_init__(self) -> None:
        self.hook = TracingHook(SpanPipeline.build(self.memory, batch=False), MODEL, self.ratio, self.export_content)
        self.state = AgentState(AgentConfig(rings=["unused"], exposition=ExpositionConfig(model_name=MODEL),
                                            slow=SlowRequestConfig(min_requests_for_p99=self.min_requests_for_p99)), on_rows=self.hook.add_rows)

    def poll(self, harness: Harness) -> None:
        frames = harness.read_frames()
        self.state.ingest(frames)
        self.hook.ingest(frames, 0, harness.consumer.anchor)  # type: ignore[union-attr]
        self.hook.flush()

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def request_spans(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s.attributes and "infersight.request_id" in s.attributes]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        sid = parent.context.span_id
        return sorted((s for s in self.spans if s.parent is not None and s.parent.span_id == sid),
                      key=lambda s: s.start_time)
