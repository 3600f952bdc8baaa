"""The KV batch sequencer's rules without sockets (infersight.sources.vllm.kv_sequence): gaps, replays
that answer short of newer gaps, restarts and garbage sequence numbers."""
from __future__ import annotations

import time

from infersight.sources.vllm import kv_wire as wire
from infersight.sources.vllm.kv_sequence import BatchSequencer


def test_a_garbage_sequence_number_is_counted_not_walked() -> None:
    seq = BatchSequencer(replay=False, timeout_s=1.0, max_held=10)
    start = time.monotonic()
    seq.live(wire.KVBatch(0, 1.0, 0, []), start)
    seq.live(wire.KVBatch(2**63, 1.0, 0, []), start)
    assert time.monotonic() - start < 0.1
    assert (seq.stats.applied, seq.stats.gaps, seq.stats.lost["no_replay"]) == (2, 1, 2**63 - 1)
    seq.live(wire.KVBatch(1, 1.0, 0, []), start)  # back below the highest: a restart, not a gap
    assert (seq.stats.restarts, seq.stats.lost["late_join"]) == (1, 1)


def test_the_replay_asks_again_while_new_gaps_outrun_complete_answers() -> None:
    """The rule without sockets: an answer that reached every batch known when asked, ending before a
    newer gap, is followed by another request; the holes an answer passes by are lost."""
    seq, b = BatchSequencer(replay=True, timeout_s=10.0, max_held=100), lambda n: wire.KVBatch(n, 1.0, 0, [])
    for n in (0, 2):
        seq.live(b(n), 0.0)
    assert seq.take_request() == 1
    for lo in (3, 6):  # live lo, (lo+1 lost in transit), lo+2; then the answer from lo-2 to lo-1
        seq.live(b(lo), 0.0)
        seq.live(b(lo + 2), 0.0)
        seq.replayed(b(lo - 2), 0.0)
        seq.ignored(lo - 1)
        seq.replay_end(0.0)
        assert seq.take_request() == lo + 1 and sum(seq.stats.lost.values()) == 0
    seq.replayed(b(7), 0.0)
    seq.replay_end(0.0)
    assert (seq.stats.applied, seq.stats.replay_requests, seq.replay_open) == (9, 3, False)
    seq.live(b(10), 0.0)
    assert seq.take_request() == 9
    seq.ignored(10)  # the answer passes 9 by: it was not in vLLM's buffer
    seq.replay_end(0.0)
    assert (seq.stats.lost["not_buffered"], seq.stats.applied, seq.replay_open) == (1, 10, False)
