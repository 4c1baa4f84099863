"""A node's upload slots, for its connections' writer tasks (the policy is core's
:class:`~tensorhub.core.swarm.UploadSlots`; this adds the futures the writers await)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from ..core.naming import ShardKey
from ..core.swarm import UploadSlots
from ..core.swarm.presets import NODE

DEFAULT_SLOTS = NODE.upload_slots
DEFAULT_MAX_WAITING = NODE.max_waiting
DEFAULT_PER_PEER = NODE.uploads_per_peer


@dataclass
class Grant:
    peer: str
    ticket: int
    ready: asyncio.Future[None]
    held: bool = False  # the slot is ours until released


class UploadGrants:
    def __init__(
        self,
        slots: int = DEFAULT_SLOTS,
        max_waiting: int = DEFAULT_MAX_WAITING,
        near_waiting: int | None = None,
        per_peer: int | None = DEFAULT_PER_PEER,
        near: Callable[[str], bool] | None = None,
    ) -> None:
        self.policy = UploadSlots(slots, max_waiting, near_waiting, per_peer)
        self.near = near
        """Is a requester in our rack? (from the layer that knows where nodes are)"""
        self._waiting: dict[int, Grant] = {}
        self._tickets = itertools.count()
        self.bytes_to: Counter[str] = Counter()  # chunk bytes uploaded, by requesting node
        self.bytes_by_version: dict[tuple[str, int], Counter[str]] = {}  # (key, v) → peer

    def count(self, peer: str, key: ShardKey, version: int, n: int) -> None:
        """``n`` bytes of (key, version) were uploaded to ``peer``."""
        self.bytes_to[peer] += n
        self.bytes_by_version.setdefault((key, version), Counter())[peer] += n

    def admit(self, peer: str) -> bool:
        """False: the node is too busy for ``peer``; refuse it so it asks elsewhere."""
        return self.policy.admit(self.near is not None and self.near(peer))

    def request(self, peer: str) -> Grant:
        fut = asyncio.get_running_loop().create_future()
        g = Grant(peer, next(self._tickets), fut)
        if self.policy.request(peer, g.ticket):
            g.held = True
            fut.set_result(None)
        else:
            self._waiting[g.ticket] = g
        return g

    def release(self, grant: Grant) -> None:
        """The upload ``grant`` was for is flushed, or will never be sent."""
        if not grant.held:
            if self._waiting.pop(grant.ticket, None) is not None:
                self.policy.cancel(grant.peer, grant.ticket)
            grant.ready.cancel()
            return
        grant.held = False
        for _peer, ticket in self.policy.release(grant.peer):
            g = self._waiting.pop(cast(int, ticket))
            g.held = True
            if g.ready.done():  # its waiter was cancelled meanwhile: pass the slot on
                self.release(g)
            else:
                g.ready.set_result(None)
