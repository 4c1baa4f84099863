"""Fetching a whole version from one peer: manifest, then chunks with a window in flight.

This is the point-to-point path the swarm is built from: it keeps ``window`` chunk requests
outstanding so the connection never idles between chunks, lands every payload in the
destination tensors, and verifies each chunk before it counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..core.histogram import CHUNK_BUCKETS, Histogram
from ..core.manifest import Manifest
from ..core.naming import ShardKey, split_key
from ..io.tensors import TensorBytes
from .peer import PeerHandler
from .store import Replica

DEFAULT_WINDOW = 8
"""Chunk requests in flight per peer: 8 x 4 MiB keeps a loopback link busy."""


@dataclass(frozen=True)
class FetchResult:
    key: ShardKey
    """What was fetched, as the data plane names it (see :attr:`model`, :attr:`shard`)."""
    version: int
    manifest: Manifest
    bytes: int
    chunks: int
    seconds: float
    manifest_seconds: float
    failures: dict[str, int] = field(default_factory=dict)
    """Requests that failed on the way, by reason (corrupt, holder lost, redirected…)."""
    sources: dict[str, int] = field(default_factory=dict)
    """Verified bytes received from each holder (by address)."""
    chunk_seconds: Histogram = field(default_factory=lambda: Histogram(CHUNK_BUCKETS))
    """How long each chunk that landed took, from its request to verified."""
    delta_base: int | None = None
    """The version held here that a delta rebuilt this one from (None: chunks came whole;
    :mod:`tensorhub.core.delta`)."""
    delta_bytes: int = 0
    """Bytes of the delta object received (``bytes`` counts the chunks that came whole)."""
    delta_chunks: int = 0
    """Chunks rebuilt from the delta and verified."""
    delta_refused: int = 0
    """Chunks the delta rebuilt wrong (a stale or corrupt base), then fetched whole."""

    @property
    def model(self) -> str:
        return split_key(self.key)[0]

    @property
    def shard(self) -> int:
        return split_key(self.key)[1]

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


async def fetch_chunks(peer: PeerHandler, replica: Replica, window: int = DEFAULT_WINDOW) -> None:
    """Fetch every chunk ``replica`` lacks from ``peer``, ``window`` at a time."""
    todo = iter([i for i, h in enumerate(replica.have) if not h])

    async def lane() -> None:
        for i in todo:
            await peer.get_chunk(replica, i)

    await asyncio.gather(*(lane() for _ in range(max(1, window))))


async def fetch_version(
    peer: PeerHandler,
    key: ShardKey,
    version: int,
    into: Mapping[str, torch.Tensor],
    *,
    expected_root: bytes | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[Replica, FetchResult]:
    """Fetch (key, version) from ``peer`` into ``into`` (preallocated, same names,
    dtypes and shapes). On return every byte is verified and ``into`` holds the version."""
    t0 = time.perf_counter()
    manifest = await peer.get_manifest(key, version, expected_root)
    t1 = time.perf_counter()
    data = TensorBytes.for_destination(manifest, into)
    replica = Replica(key, version, manifest, data)
    await fetch_chunks(peer, replica, window)
    data.finalize()
    t2 = time.perf_counter()
    return replica, FetchResult(
        key, version, manifest, manifest.total_bytes, manifest.num_chunks, t2 - t0, t1 - t0
    )
