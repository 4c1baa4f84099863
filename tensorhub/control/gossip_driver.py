"""The asyncio driver of gossip for one node: ticks, the transport, durable identity.

Gossip travels over the node's authenticated TCP connections (the same transport as the
data plane; a stranger can neither read nor inject membership or holder state). A tick is
20 ms by default, so a protocol period (10 ticks) is 200 ms; the driver wakes only for
the ticks where the core has something to do (``GossipCore.next_due``).

Identity across restarts: with a ``data_dir``, the incarnation and generation are kept in
``gossip.state`` (msgpack, written atomically, fsync'd) and bumped on every start, so a
restarted node always refutes its old death and peers drop what it held in its previous
life. Without one, both start from the wall clock in milliseconds (monotonic across
restarts on one host as long as the clock does not go backwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from ..core.errors import TensorHubError
from ..core.gossip import GossipConfig, GossipCore
from ..core.gossip.holders import Holding, encode_holding, encode_lag, hold_key, lag_key
from ..core.gossip.messages import (
    GAck,
    GDelta,
    GGossip,
    GNack,
    GPing,
    GPingReq,
    GPushPull,
    GStatusReply,
    GStatusReq,
    GSyn,
    GSynAck,
)
from ..core.messages import Message
from ..core.naming import ShardKey
from ..dataplane.node import Node
from ..dataplane.peer import PeerHandler
from ..io.files import atomic_write
from .outbox import PeerOutbox

log = logging.getLogger(__name__)

TICK_SECONDS = 0.02

Changes = Callable[[dict[tuple[str, int], set[str]], set[str]], None]
"""Told (model, version) → nodes whose holder advertisement changed, and the members
whose status changed, after each gossip step that changed something."""
GOSSIP_TYPES = (GPing, GAck, GPingReq, GNack, GGossip, GSyn, GSynAck, GDelta, GPushPull)


class _Identity(msgspec.Struct):
    incarnation: int
    generation: int


def next_identity(data_dir: str | os.PathLike[str] | None) -> tuple[int, int]:
    """This start's (incarnation, generation): one more than the last start's."""
    if data_dir is None:
        now = time.time_ns() // 1_000_000
        return now, now
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "gossip.state"
    ident = _Identity(0, 0)
    if path.exists():
        try:
            ident = msgspec.msgpack.decode(path.read_bytes(), type=_Identity)
        except (msgspec.DecodeError, ValueError) as e:
            raise TensorHubError(f"{path} is corrupt ({e}); refusing to reuse an identity") from e
    ident = _Identity(ident.incarnation + 1, ident.generation + 1)
    atomic_write(path, msgspec.msgpack.encode(ident))
    return ident.incarnation, ident.generation


class GossipNode:
    def __init__(
        self,
        node: Node,
        locality: str,
        seeds: Iterable[str] = (),
        *,
        data_dir: str | os.PathLike[str] | None = None,
        config: GossipConfig | None = None,
        tick: float = TICK_SECONDS,
        seed: int | None = None,
    ) -> None:
        self.node = node
        inc, gen = next_identity(data_dir)
        self.core = GossipCore(
            node.name,
            node.address,
            locality,
            random.Random(seed if seed is not None else os.urandom(8)),
            config=config,
            incarnation=inc,
            generation=gen,
            seeds=[s for s in seeds if s != node.address],
        )
        self.tick_seconds = tick
        self._outbox = PeerOutbox(node, limit=256, backoff=tick * 5, max_backoff=tick * 5)
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0  # the tick the timer is set for
        self._anchor: tuple[float, int] | None = None  # (loop time, the core's tick then)
        self.wakeups = 0
        """Times the timer woke us (an idle node: a few per round, not one per tick)."""
        self.on_changes: list[Changes] = []
        for t in GOSSIP_TYPES:
            node.control[t] = self._on_message
        node.control[GStatusReq] = self._on_status

    async def start(self) -> None:
        self.core.join()
        self._anchor = (asyncio.get_running_loop().time(), self.core.now)
        self._flush()
        self._arm()

    async def stop(self) -> None:
        self._anchor = None  # (a message handled after this sets no timer)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._outbox.close()

    # -- holder advertisements -----------------------------------------------------------------

    def advertise(
        self,
        key: ShardKey,
        version: int,
        have: bytes | bytearray,
        *,
        origin: bool = False,
        borrowed: bool = False,
        lagging: bool = False,
    ) -> None:
        """Tell the cluster which chunks of (key, version) we hold, verified, whether
        that memory is the application's to reuse (``borrowed``), and whether our relay
        fell behind (``lagging``)."""
        self._catch_up()
        holding = Holding.of(have, origin, borrowed, lagging)
        self.core.set_local(hold_key(key, version), encode_holding(holding))

    def withdraw(self, key: ShardKey, version: int) -> None:
        self._catch_up()
        self.core.delete_local(hold_key(key, version))

    def remember_lag(self, key: ShardKey, version: int, lagged: bool) -> None:
        """Our fetch of (key, version) ended: keep whether our relay fell behind in it as
        our lag memory of ``key``, which every node's next fetch of it reads
        (holders.py), or clear it."""
        self._catch_up()
        name, value = lag_key(key), encode_lag(version)
        if not lagged:
            self.core.delete_local(name)  # (nothing sent if there was none)
        elif self.core.state.get(self.core.name, name) != value:
            self.core.set_local(name, value)

    # -- plumbing ------------------------------------------------------------------------------

    # The core's clock. A tick happens every ``tick_seconds``, but the timer wakes us only
    # for the ticks the core is due at (GossipCore.next_due): the others only count, and
    # are counted when we next touch the core (a message, a write, the timer), so its
    # ``now`` is the same there as a timer every tick would have made it. A late timer
    # (a busy event loop) is not caught up: the clock moves on from when it fired, as
    # the old sleep-a-tick loop's did, so a stalled process does not come back to a burst
    # of expired probe timeouts.

    def _clock(self) -> int:
        """The tick it is now, by the anchor (set when the timer last fired); before
        :meth:`start`, the core's own (nothing counts ticks yet)."""
        if self._anchor is None:
            return self.core.now
        at, tick = self._anchor
        return tick + int((asyncio.get_running_loop().time() - at) / self.tick_seconds)

    def _catch_up(self, to: int | None = None) -> None:
        """Count the ticks up to ``to`` (default: now by the clock) into the core."""
        to = self._clock() if to is None else to
        while self.core.now < to:
            self.core.tick()

    def _arm(self) -> None:
        """Set the timer for the tick the core is next due at, if it moved."""
        if self._anchor is None:  # (not started, or stopped: no timer)
            return
        due = self.core.next_due()
        if self._timer is not None:
            if due == self._due:
                return
            self._timer.cancel()
        at, tick = self._anchor
        self._due = due
        self._timer = asyncio.get_running_loop().call_at(
            at + (due - tick) * self.tick_seconds, self._on_due
        )

    def _on_due(self) -> None:
        self._timer = None
        self.wakeups += 1
        self._catch_up(self._due)
        self._anchor = (asyncio.get_running_loop().time(), self.core.now)
        self._flush()
        self._arm()

    def _on_message(self, _peer: PeerHandler, msg: Message) -> None:
        self._catch_up()
        self.core.receive(msg)
        self._flush()
        self._arm()

    def _on_status(self, peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, GStatusReq)
        c = self.core
        holders = tuple(
            (model, version, tuple(sorted(c.holders.holders(model, version))))
            for model, version in c.holders.versions()
        )
        reply = GStatusReply(msg.req, c.me.update(), tuple(c.members.updates()), holders)
        with contextlib.suppress(TensorHubError, OSError):
            peer.conn.send_nowait(reply)

    def _flush(self) -> None:
        """Send what the core queued, and hand on what changed."""
        out, self.core.outbox = self.core.outbox, []
        for addr, msg in out:
            self._outbox.send(addr, msg)
        holders, members = self.core.take_changes()
        if holders or members:
            for tell in self.on_changes:
                try:
                    tell(holders, members)
                except Exception:  # a listener's bug must not stop gossip
                    log.exception("%s: a gossip change listener failed", self.node.name)
