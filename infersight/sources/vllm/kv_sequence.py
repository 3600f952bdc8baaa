"""Sequence numbers of one vLLM KV event publisher: order, gaps, replay, restarts (no sockets here).

vLLM numbers its batches 0, 1, 2, ... per publisher process, and a PUB socket delivers them in order
or not at all. So, on the live stream:

    seq == next        apply it (and any held batches that follow)
    seq >  highest+1   a gap: hold the batch, ask the replay endpoint for everything from `next`
    seq <= highest     the publisher restarted (a new process counts from 0 again): a new epoch

       applied        holes (replay fills them)     held (received live, waiting)
    ... 4  5 | 6  7  [8]  9  10 [11] ... highest
               ^next

A replayed batch is used only to fill a hole; replayed batches above `highest` are ignored (their live
copy is still in flight, and would otherwise look like a restart). vLLM answers a replay with its
buffer from the start asked for up to what it had published *when it answered*; a gap whose live
successor came after that (a slow round trip, a gap every few batches) is beyond the answer, so the
end marker asks again for it. Each round settles every hole known when it asked, so the rounds end
with the gaps. The replay ends with vLLM's end marker, when the holes are filled, on its deadline, or
when too many batches are held; holes still open then are lost, counted by reason:

    late_join     before the first batch this epoch received (the agent started, or the restarted
                  publisher connected, after vLLM had published them) and not replayable
    not_buffered  the replay's answer passed them by (older than vLLM's replay buffer)
    timeout       the replay endpoint did not answer in time
    overflow      more than max_held batches waited for a replay
    restart       the publisher restarted while a replay was open
    no_replay     no replay endpoint configured

The first hole of an epoch is not counted as a gap (nothing was dropped in transit; we joined late).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from infersight.sources.vllm.kv_wire import KVBatch

LOST_REASONS = ("late_join", "not_buffered", "timeout", "overflow", "restart", "no_replay")
#: A replay that keeps answering may run this many replay timeouts in all, no longer.
MAX_REPLAY_TIMEOUTS = 5


@dataclass(frozen=True)
class Restart:
    """Marker in the output: the publisher restarted before the batch that follows (wall ts)."""

    ts: float


@dataclass
class SequenceStats:
    """Counts in batches (sequence numbers), cumulative."""

    applied: int = 0
    gaps: int = 0
    replayed: int = 0
    replay_requests: int = 0
    restarts: int = 0
    ignored_replays: int = 0
    lost: dict[str, int] = field(default_factory=lambda: {r: 0 for r in LOST_REASONS})


@dataclass
class _Session:
    start: int
    asked_to: int       # the highest live batch when asked: vLLM had buffered it before it answered
    started_at: float
    deadline: float
    reached: int = -1   # the highest batch the answer has brought (used or not), at most `highest`


class BatchSequencer:
    """Feeds batches in sequence order to `out`, asking for replays of what is missing.

    The caller sends the replay request that `take_request()` hands out, passes live batches to
    `live()`, replayed ones to `replayed()`, the end marker to `replay_end()`, and calls `tick()`
    each poll. `sessions_ended` grows whenever a replay stops, so the caller can reopen its replay
    socket (replies still in flight from an ended replay must not be read as the next one's).
    """

    def __init__(self, replay: bool, timeout_s: float, max_held: int) -> None:
        self.replay_enabled = replay
        self.timeout_s = timeout_s
        self.max_held = max_held
        self.stats = SequenceStats()
        self.out: list[KVBatch | Restart] = []
        self.sessions_ended = 0
        self._epoch_started = False
        self._next = 0       # lowest sequence number not yet applied or lost
        self._highest = -1   # highest live sequence number this epoch
        self._join_end = 0   # first live sequence number this epoch: holes below it are late_join
        self._held: dict[int, KVBatch] = {}
        self._session: _Session | None = None
        self._request: int | None = None

    @property
    def replay_open(self) -> bool:
        return self._session is not None

    def take_request(self) -> int | None:
        """The start sequence number of a replay request to send now, if any."""
        start, self._request = self._request, None
        return start

    def wants(self, seq: int) -> bool:
        """Whether a replayed batch with this sequence number would fill a hole (decode it only then)."""
        return self._session is not None and self._next <= seq < self._highest and seq not in self._held

    def live(self, batch: KVBatch, now: float) -> None:
        seq = batch.seq
        if not self._epoch_started:
            self._epoch_started, self._join_end = True, seq
        elif seq <= self._highest:
            self._restart(batch, now)
        elif seq > self._highest + 1 and self._highest >= 0:
            self.stats.gaps += 1
        self._held[seq] = batch
        self._highest = seq
        self._advance()
        if self._holes():
            self._need_replay(now)
        if len(self._held) > self.max_held:
            self._lose_to(self._highest, "overflow")

    def ignored(self, seq: int) -> None:
        """A replayed batch that fills no hole: unused, but it says how far the answer has come."""
        self.stats.ignored_replays += 1
        if self._session is not None:  # capped: a garbage number must not pass every hole by
            self._session.reached = max(self._session.reached, min(seq, self._highest))

    def replayed(self, batch: KVBatch, now: float) -> None:
        if not self.wants(batch.seq):
            self.ignored(batch.seq)
            return
        assert self._session is not None
        self._held[batch.seq] = batch
        self.stats.replayed += 1
        self._session.reached = max(self._session.reached, batch.seq)
        # Progress extends the deadline, within a bound on the whole replay.
        self._session.deadline = min(now + self.timeout_s,
                                     self._session.started_at + MAX_REPLAY_TIMEOUTS * self.timeout_s)
        self._advance()

    def replay_end(self, now: float) -> None:
        session = self._session
        if session is None:
            return
        if self._holes():
            # Holes the answer passed by were not in vLLM's buffer. Holes beyond it were published
            # after the ROUTER answered, if the answer reached every batch known when we asked (it
            # must: vLLM buffers a batch before it serves the next request): ask again for those.
            # Asking only once lost a batch whenever two rounds in a row were outrun by a new gap.
            self._lose_to(session.reached, "not_buffered")
            if self._holes() and session.reached >= session.asked_to:
                self._open(now)
                return
            self._lose_to(self._highest, "not_buffered")
        self._end_session()

    def tick(self, now: float) -> None:
        if self._session is not None and now >= self._session.deadline:
            self._lose_to(self._highest, "timeout")

    # -- internals ---------------------------------------------------------------------------
    def _holes(self) -> int:
        """Sequence numbers in [next, highest] neither applied nor held."""
        return max(0, self._highest - self._next + 1 - len(self._held))

    def _need_replay(self, now: float) -> None:
        if not self.replay_enabled:
            self._lose_to(self._highest, "no_replay")
        elif self._session is None:
            self._open(now)

    def _open(self, now: float) -> None:
        if self._session is not None:
            self._end_session()
        self._session = _Session(self._next, self._highest, now, now + self.timeout_s)
        self._request = self._next
        self.stats.replay_requests += 1

    def _end_session(self) -> None:
        if self._session is not None:
            self._session = None
            self._request = None
            self.sessions_ended += 1

    def _advance(self) -> None:
        while self._next in self._held:
            self.out.append(self._held.pop(self._next))
            self.stats.applied += 1
            self._next += 1
        if not self._holes():
            self._end_session()

    def _lose_to(self, last: int, reason: str) -> None:
        """Give up on every hole up to `last`, applying the held batches among them in order.
        Counted, not walked: a garbage sequence number can open a hole of 2**64."""
        if last < self._next:
            return
        held = sorted(seq for seq in self._held if seq <= last)
        late_end = min(last + 1, self._join_end)
        late = max(0, late_end - self._next) - sum(1 for seq in held if seq < late_end)
        self.stats.lost["late_join"] += late
        self.stats.lost[reason] += (last + 1 - self._next) - len(held) - late
        for seq in held:
            self.out.append(self._held.pop(seq))
            self.stats.applied += 1
        self._next = last + 1
        self._advance()

    def _restart(self, batch: KVBatch, now: float) -> None:
        self._lose_to(self._highest, "restart")
        self._end_session()
        self.stats.restarts += 1
        self.out.append(Restart(batch.ts))
        self._next, self._highest, self._join_end = 0, -1, batch.seq
