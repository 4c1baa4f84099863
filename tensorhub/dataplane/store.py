"""The versions this node holds in memory, and which of their chunks are verified.

A :class:`Replica` is a version's manifest plus the tensor memory its chunks live in. A
publisher's replica is complete at once; a fetcher's fills chunk by chunk, and a chunk is
marked held only after its digest matched (so it is never served or advertised before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..core.errors import UnknownVersion
from ..core.manifest import Manifest
from ..core.naming import ShardKey, display_name
from ..core.swarm import SuperSeeder
from ..core.swarm.serve import fetch_starting, started_parks
from ..io.tensors import TensorBytes


class Landing:
    """One request's bytes of a chunk landing in a replica's memory: how many are there,
    and whether they ended verified or not. A node serving the chunk as it lands (cut
    through) streams from one landing and completes the stream only if that landing
    verifies: bytes from an attempt that failed (corrupt, cut off, abandoned) must not
    complete a chunk downstream, even if a later attempt fills the same memory."""

    def __init__(self) -> None:
        self.landed = 0
        self.verified = False
        self.failed = False
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def over(self) -> bool:
        return self.verified or self.failed

    def advance(self, landed: int) -> None:
        if landed > self.landed:
            self.landed = landed
            self._wake()

    def end(self, verified: bool) -> None:
        if not self.over:
            self.verified, self.failed = verified, not verified
            self._wake()

    async def reached(self, landed: int) -> None:
        """Return once ``landed`` bytes are here, or the landing is over."""
        if self.landed >= landed or self.over:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((landed, fut))
        await fut

    def poke(self) -> None:
        """Wake every waiter now, to look again: one of them has news of its own (its
        reply was cancelled); the others find nothing new and wait again."""
        waiters, self._waiters = self._waiters, []
        for _want, fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _wake(self) -> None:
        if not self._waiters:
            return
        keep = []
        for want, fut in self._waiters:
            if self.landed >= want or self.over:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((want, fut))
        self._waiters = keep


@dataclass
class Replica:
    key: ShardKey
    version: int
    manifest: Manifest
    data: TensorBytes
    have: bytearray = field(default_factory=bytearray)
    readers: int = 0  # uploads reading this replica's memory now
    withdrawn: bool = False
    seeder: SuperSeeder | None = None  # set on an origin's replica: it super-seeds
    incoming: dict[int, str] = field(default_factory=dict)
    """Chunks this node is receiving now, each with the name of the peer it asked ("" until
    connected): a peer asking for one waits for it here (serve_decision's ``incoming``),
    unless it is that peer, which would wait on us while we wait on it."""
    onward: bool = True  # serves what it receives (False: a partial read, see swarm_fill)
    lagging: bool = False  # a relay link that fell behind: it parks no request (see lag)
    laggards: set[str] = field(default_factory=set)
    """On an origin's replica: relay links of this version a fetcher told us are slower
    than we could feed it (``Behind.who``): no recipient to send an asker to."""
    _parked: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    _landings: dict[int, Landing] = field(default_factory=dict)  # chunk -> its bytes landing
    _awaiting_bytes: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if not self.have:
            self.have = bytearray(self.manifest.num_chunks)
        self._idle.set()

    @property
    def complete(self) -> bool:
        return all(self.have)

    @property
    def held(self) -> int:
        return sum(self.have)

    def held_chunks(self) -> list[int]:
        """The chunks verified here, in order (what a new asker is told: PeerHandler)."""
        return [c for c, h in enumerate(self.have) if h]

    def mark(self, chunk: int, landing: Landing | None = None) -> None:
        """``chunk`` is verified (its bytes came through ``landing``, if one). Our first:
        requests parked because we were starting are answered again (``started_parks``)."""
        first = self.have.find(1) < 0
        self.have[chunk] = 1
        if landing is not None:
            landing.end(verified=True)
        self._landings.pop(chunk, None)
        self.data.landed(chunk)  # its device copy (if any) overlaps the rest of the fetch
        self.settle(chunk)
        if first:
            parked = {*self._parked, *self._awaiting_bytes}
            for c in started_parks(parked, self._landings.__contains__):
                self.settle(c)

    def starting(self, chunk: int) -> bool:
        """Is ``chunk`` one of the version's first (``START_PARK_CHUNKS``) while our fetch of
        it began and holds none of it yet (serve_decision's ``starting``)? A replica in the
        store that lacks chunks is being fetched: swarm_fill adds it as the fetch begins and
        removes it if the fetch fails, which answers every request parked here."""
        return fetch_starting(chunk, fetching=self.onward, lagging=self.lagging, have=self.have)

    def begin_landing(self, chunk: int) -> Landing:
        """A request's bytes of ``chunk`` begin to land in our memory: requests parked
        until then (cut through) are answered now."""
        old = self._landings.get(chunk)
        if old is not None:
            old.end(verified=False)  # (its request is over: a new one writes the memory)
        landing = self._landings[chunk] = Landing()
        for answer in self._awaiting_bytes.pop(chunk, []):
            answer()
        return landing

    def end_landing(self, chunk: int, landing: Landing) -> None:
        """``landing``'s request ended without verifying the chunk."""
        landing.end(verified=False)
        if self._landings.get(chunk) is landing:
            del self._landings[chunk]

    def landing(self, chunk: int) -> Landing | None:
        """The bytes of ``chunk`` landing here now, if any (not yet verified)."""
        return self._landings.get(chunk)

    def park(self, chunk: int, answer: Callable[[], None], until_bytes: bool = False) -> None:
        """A peer asked for ``chunk`` while it is on its way here: answer once it is
        verified (or once it is not coming after all), instead of "not yet" and a retry;
        ``until_bytes``: already once its bytes begin to land (cut through)."""
        (self._awaiting_bytes if until_bytes else self._parked).setdefault(chunk, []).append(answer)

    def parked(self, chunk: int) -> int:
        """How many requests for ``chunk`` wait here for it."""
        return len(self._parked.get(chunk, ())) + len(self._awaiting_bytes.get(chunk, ()))

    def settle(self, chunk: int) -> None:
        """``chunk`` arrived, or its requests ended without it: answer who waited for it."""
        for answer in self._parked.pop(chunk, []) + self._awaiting_bytes.pop(chunk, []):
            answer()

    def lag(self) -> None:
        """Our fetch fell behind its relay upstream and now relays from the chain's tail:
        what we lack reaches us only after our downstream has it, so every request parked
        for it is answered now (busy: serve_decision), and none is parked from now on."""
        self.lagging = True
        for chunk in {*self._parked, *self._awaiting_bytes}:
            if chunk not in self._landings:  # (bytes landing now: those go on)
                self.settle(chunk)

    def settle_all(self) -> None:
        for chunk in {*self._parked, *self._awaiting_bytes}:
            self.settle(chunk)
        for chunk, landing in list(self._landings.items()):
            self.end_landing(chunk, landing)

    def begin_read(self) -> None:
        self.readers += 1
        self._idle.clear()

    def end_read(self) -> None:
        self.readers -= 1
        if self.readers == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Wait until no upload reads this replica's memory."""
        await self._idle.wait()


class LocalStore:
    """(key, version) → Replica for everything this node can serve."""

    def __init__(self) -> None:
        self._replicas: dict[tuple[str, int], Replica] = {}

    def add(self, replica: Replica) -> None:
        key = (replica.key, replica.version)
        if key in self._replicas:
            raise ValueError(f"{replica.key} v{replica.version} is already held here")
        self._replicas[key] = replica

    def get(self, key: ShardKey, version: int) -> Replica:
        r = self._replicas.get((key, version))
        if r is None or r.withdrawn:
            raise UnknownVersion(f"{display_name(key)} v{version} is not held by this node")
        return r

    def replace(self, replica: Replica) -> Replica:
        """Serve ``replica`` instead of the one held for its version, atomically (no request
        sees the version missing); returns the old one, withdrawn."""
        old = self.get(replica.key, replica.version)
        old.withdrawn = True
        self._replicas[(replica.key, replica.version)] = replica
        return old

    def remove(self, key: ShardKey, version: int) -> Replica:
        r = self.get(key, version)
        r.withdrawn = True
        del self._replicas[(key, version)]
        r.incoming.clear()
        r.settle_all()  # parked requests now learn it is gone
        return r

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)
