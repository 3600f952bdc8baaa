"""Metrics of the closed loop (`infersight agent --auto-apply`), not in CATALOGUE: rendered by the
loop's own collector (agent.autoapply.decisions), only when the loop is on."""
from __future__ import annotations

from infersight.exporters.catalogue.spec import MetricSpec, P

AUTOAPPLY_DECISIONS = MetricSpec(P + "autoapply_decisions", "counter",
                                 "Decisions of the closed loop, by knob (speculation, max_num_seqs) and stage "
                                 "(proposed, canaried, kept, rolled_back); each one is in GET /api/v1/decisions "
                                 "with its reason and numbers.", ("knob", "stage"))
AUTOAPPLY_IN_FLIGHT = MetricSpec(P + "autoapply_change_in_flight", "gauge",
                                 "1 while a change of this knob is being canaried (at most one change at a time).",
                                 ("knob",))
AUTOAPPLY_SPECULATION = MetricSpec(P + "autoapply_speculation_enabled", "gauge",
                                   "The speculation policy the loop set for a task: 1 speculate, 0 not (tasks the "
                                   "loop never changed are absent: the engine's default).", ("task",))
AUTOAPPLY_MAX_NUM_SEQS = MetricSpec(P + "autoapply_max_num_seqs", "gauge",
                                    "The scheduler limit the loop has in force (0: the engine's configured one).")
AUTOAPPLY_METRICS = (AUTOAPPLY_DECISIONS, AUTOAPPLY_IN_FLIGHT, AUTOAPPLY_SPECULATION, AUTOAPPLY_MAX_NUM_SEQS)
