"""Upload slots with fair choking: how a node shares its egress among the peers asking.

At most ``slots`` chunk uploads run at once (more only splits the same bandwidth into
slower streams, so every requester would finish late). Peers waiting for a slot are
unchoked round-robin, one chunk each, so a peer with many requests queued cannot starve
one with few. A request that would wait behind ``max_waiting`` others is refused at once
("busy"): its fetcher asks another holder instead of queueing here (a request waiting in a
queue holds one of its fetcher's few request slots and moves no bytes).

A *near* requester (our rack) may wait behind ``near_waiting``: it takes a chunk its rack
holds only from inside the rack, so "ask another holder" leaves it fewer choices than a
farther requester has. With one shared limit, a rack's last fetcher lost the race for its
rack-mates' queues over and over while they served other racks, and finished far behind
its rack (``python -m sim``, pure broadcast, seeds 1, 3, 5: the last of 48 receivers at
1.12-1.22x the bound with one limit of 1; 1.09-1.11x with 2 for the rack).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable


class UploadSlots:
    def __init__(
        self,
        slots: int = 4,
        max_waiting: int = 64,
        near_waiting: int | None = None,
        per_peer: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("at least one upload slot")
        if per_peer is not None and per_peer < 1:
            raise ValueError("per_peer: at least one upload per peer, or None")
        self.slots = slots
        self.max_waiting = max_waiting
        self.near_waiting = max(max_waiting, near_waiting or 0)  # never less than the rest
        self.per_peer = per_peer
        """Uploads to one peer at once (None: up to ``slots``). Two chunks sent to the
        same peer at once share its path, so each arrives later than if they were sent
        one after the other, and a store-and-forward relay can pass on nothing until a
        chunk is whole: with 1, a fetcher's requests to us are a queue, not a split."""
        self.active = 0
        self._active_to: dict[str, int] = {}
        self._queues: OrderedDict[str, deque[Hashable]] = OrderedDict()  # rotation order
        self.waiting = 0
        self.refused = 0

    def has_spare(self) -> bool:
        """Two or more slots idle and nobody waiting: room to serve something optional
        (a super-seeding origin's repeat copy) and still start the next request at once."""
        return self.active + 2 <= self.slots and not self.waiting

    def admit(self, near: bool = False) -> bool:
        """May one more request (from our rack if ``near``) be queued? (False: "busy".)"""
        limit = self.near_waiting if near else self.max_waiting
        if self.active >= self.slots and self.waiting >= limit:
            self.refused += 1
            return False
        return True

    def _peer_full(self, peer: str) -> bool:
        return self.per_peer is not None and self._active_to.get(peer, 0) >= self.per_peer

    def _start(self, peer: str) -> None:
        self.active += 1
        self._active_to[peer] = self._active_to.get(peer, 0) + 1

    def request(self, peer: str, ticket: Hashable) -> bool:
        """``ticket`` of ``peer`` wants a slot: True if it has one now, else it waits."""
        if (
            self.active < self.slots
            and not self._peer_full(peer)
            and all(self._peer_full(p) for p in self._queues)  # nobody eligible ahead
        ):
            self._start(peer)
            return True
        self._queues.setdefault(peer, deque()).append(ticket)
        self.waiting += 1
        return False

    def cancel(self, peer: str, ticket: Hashable) -> None:
        q = self._queues.get(peer)
        if q is not None and ticket in q:
            q.remove(ticket)
            self.waiting -= 1
            if not q:
                del self._queues[peer]

    def release(self, peer: str) -> list[tuple[str, Hashable]]:
        """An upload to ``peer`` finished: the (peer, ticket) pairs that get a slot now,
        round-robin over the peers that may have one more."""
        self.active -= 1
        left = self._active_to.get(peer, 0) - 1
        if left > 0:
            self._active_to[peer] = left
        else:
            self._active_to.pop(peer, None)
        out = []
        while self.active < self.slots:
            nxt = next((p for p in self._queues if not self._peer_full(p)), None)
            if nxt is None:
                break
            q = self._queues.pop(nxt)
            out.append((nxt, q.popleft()))
            self.waiting -= 1
            self._start(nxt)
            if q:
                self._queues[nxt] = q  # to the back of the rotation
        return out
