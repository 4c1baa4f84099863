"""Chunk and manifest digests: BLAKE3, truncated to 128 bits.

The digests in a committed manifest are the only thing that vouches for a chunk's bytes:
frames carrying chunk data are authenticated by their header alone (see
:mod:`tensorhub.core.auth`), so the digest must resist an adversary, not only corruption.
BLAKE3 does (finding a second chunk with a committed 128-bit digest takes ~2^128 work);
xxh3, used before, does not. One BLAKE3 pass replaces xxh3 plus a Poly1305 pass over every
byte on both ends, and it releases the GIL, so the fetch path verifies chunks on worker
threads while the next ones arrive (measured in docs/results.md, "authenticated frames").

``threads=True`` spreads one large input over cores (BLAKE3's Rayon pool). Chunks are
hashed one per thread instead, many at once (publishing: ``io.tensors.build_manifest``;
fetching: a chunk per executor thread), which also keeps Rayon's pool out of processes
where it was seen to block (a Ray actor under CPU contention).
"""

from __future__ import annotations

from collections.abc import Iterable

import blake3

from ..typing import Buffer

DIGEST_SIZE = 16
_AUTO = blake3.blake3.AUTO


def digest(data: Buffer, threads: bool = False) -> bytes:
    """BLAKE3-128 of one contiguous buffer."""
    return bytes(blake3.blake3(data, max_threads=_AUTO if threads else 1).digest(DIGEST_SIZE))


def digest_parts(parts: Iterable[Buffer], threads: bool = False) -> bytes:
    """BLAKE3-128 of the concatenation of ``parts``, without concatenating them."""
    h = blake3.blake3(max_threads=_AUTO if threads else 1)
    for part in parts:
        h.update(part)
    return bytes(h.digest(DIGEST_SIZE))


class RunningDigest:
    """BLAKE3-128 of bytes fed in order, a piece at a time: a chunk that arrives in pieces
    is hashed as they land, so that once its last byte is in only that last piece is left
    to hash (see ``dataplane.peer.HASH_INLINE_RATE``). One thread at a time."""

    __slots__ = ("_h", "fed")

    def __init__(self) -> None:
        self._h = blake3.blake3(max_threads=1)
        self.fed = 0
        """Bytes fed so far."""

    def update(self, parts: Iterable[Buffer]) -> None:
        for part in parts:
            self._h.update(part)
            self.fed += memoryview(part).nbytes

    def digest(self) -> bytes:
        return bytes(self._h.digest(DIGEST_SIZE))

    def finish(self, parts: Iterable[Buffer]) -> bytes:
        """The digest, once ``parts`` (the rest) are fed: a worker thread's whole job."""
        self.update(parts)
        return self.digest()
