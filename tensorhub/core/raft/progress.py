"""The leader's view of each follower: how far it matches, what to send next."""

from __future__ import annotations

from collections import deque
from enum import Enum


class PState(Enum):
    PROBE = "probe"  # one append at a time until we find where the logs match
    REPLICATE = "replicate"  # pipelined appends, up to max_inflight unacknowledged
    SNAPSHOT = "snapshot"  # a snapshot is on its way; send nothing else


class Progress:
    def __init__(self, next_index: int, max_inflight: int, learner: bool = False) -> None:
        self.match = 0
        self.next = next_index
        self.state = PState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.learner = learner
        self.inflight: deque[int] = deque()
        self.max_inflight = max_inflight

    def maybe_update(self, n: int) -> bool:
        updated = self.match < n
        if updated:
            self.match = n
            self.probe_sent = False
        self.next = max(self.next, n + 1)
        return updated

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """Back off after a rejected append; False if the rejection is stale."""
        if self.state is PState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is PState.PROBE:
            return self.probe_sent
        if self.state is PState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True

    def become_probe(self) -> None:
        if self.state is PState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
            self.pending_snapshot = 0
        else:
            self.next = self.match + 1
        self.state = PState.PROBE
        self.probe_sent = False
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = PState.REPLICATE
        self.next = self.match + 1
        self.inflight.clear()

    def become_snapshot(self, index: int) -> None:
        self.state = PState.SNAPSHOT
        self.pending_snapshot = index
        self.inflight.clear()

    def sent(self, last: int) -> None:
        """Entries up to ``last`` were sent (optimistically advance in replicate)."""
        if self.state is PState.REPLICATE:
            self.next = last + 1
            self.inflight.append(last)
        elif self.state is PState.PROBE:
            self.probe_sent = True

    def free_first_one(self) -> None:
        if self.inflight:
            self.inflight.popleft()

    def free_to(self, index: int) -> None:
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
