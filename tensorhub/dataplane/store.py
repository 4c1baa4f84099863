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
from ..io.tensors import TensorBytes


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
    incoming: set[int] = field(default_factory=set)  # chunks this node is receiving now
    onward: bool = True  # serves what it receives (False: a partial read, see swarm_fill)
    _parked: dict[int, list[Callable[[], None]]] = field(default_factory=dict)
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

    def mark(self, chunk: int) -> None:
        self.have[chunk] = 1
        self.data.landed(chunk)  # its device copy (if any) overlaps the rest of the fetch
        self.settle(chunk)

    def park(self, chunk: int, answer: Callable[[], None]) -> None:
        """A peer asked for ``chunk`` while it is on its way here: answer once it is
        verified (or once it is not coming after all), instead of "not yet" and a retry."""
        self._parked.setdefault(chunk, []).append(answer)

    def settle(self, chunk: int) -> None:
        """``chunk`` arrived, or its requests ended without it: answer who waited for it."""
        for answer in self._parked.pop(chunk, []):
            answer()

    def settle_all(self) -> None:
        for chunk in list(self._parked):
            self.settle(chunk)

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
