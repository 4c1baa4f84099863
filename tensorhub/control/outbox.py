"""Per-peer outbound queues for control-plane messages (Raft, gossip).

Each destination address gets a bounded queue drained by its own task, so a slow or dead
peer never blocks the others or the protocol loop. Both protocols tolerate loss: when a
queue is full its oldest message is dropped, and when sending fails the queue is emptied
(its contents are stale by the time the peer is back) and the task backs off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from ..core.errors import TensorHubError
from ..core.messages import Message
from ..dataplane.node import Node

log = logging.getLogger(__name__)


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until each has finished."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


class PeerOutbox:
    def __init__(self, node: Node, *, limit: int, backoff: float, max_backoff: float) -> None:
        self.node = node
        self.limit = limit
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._queues: dict[str, asyncio.Queue[Message]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def send(self, addr: str, msg: Message) -> None:
        q = self._queues.get(addr)
        if q is None:
            q = self._queues[addr] = asyncio.Queue(self.limit)
            self.tasks.append(asyncio.get_running_loop().create_task(self._drain(addr, q)))
        if q.full():
            q.get_nowait()
        q.put_nowait(msg)

    async def _drain(self, addr: str, q: asyncio.Queue[Message]) -> None:
        backoff = self.backoff
        while True:
            msg = await q.get()
            try:
                peer = await self.node.control_peer(addr)
                await peer.conn.send(msg)
                backoff = self.backoff
            except (TensorHubError, OSError) as e:
                log.debug("%s -> %s: %s", self.node.name, addr, e)
                while not q.empty():
                    q.get_nowait()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    async def close(self) -> None:
        await cancel_all(self.tasks)
        self.tasks.clear()
