"""A chunk's digest taken as its bytes land, so it is verified a moment after its last byte.

Hashed whole once its payload completed (as until session 25), a 4 MiB chunk was verified a
BLAKE3 pass and a thread hop after its last byte landed: 9-10 ms per chunk at the relay
links of bench/linerate.py (N=8, 1 Gbit/s, nine processes on two busy cores), and a
relay cutting the chunk through holds its last piece back until then, so its uplink
idled while its downstream had caught up, and each link trailed the one before it by
that much more. BLAKE3 is incremental: hashing each run of bytes as it lands leaves only
the last run (at 1 Gbit/s a ``RECV_LOW_WATER`` of 256 KiB) for the end.

A run of at least ``off_loop`` bytes is hashed on a worker thread (BLAKE3 releases the
GIL, so a fast link's event loop goes on receiving meanwhile); a shorter one inline,
where a thread hop costs more than the hash. One run at a time, in order: the hash is
sequential. Bytes handed over as landed must never change after (the frame reader writes
a payload's bytes once, in order, into memory no other request writes: an endgame
duplicate lands in scratch, an abandoned request's rest is diverted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from ..core.digest import Digester


def byte_range(parts: Sequence[memoryview], start: int, stop: int) -> list[memoryview]:
    """Bytes ``start:stop`` of the concatenation of ``parts``, as views of them."""
    out, pos = [], 0
    for p in parts:
        n = len(p)
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            out.append(p[lo:hi])
        pos += n
        if pos >= stop:
            break
    return out


def _update(digester: Digester, views: list[memoryview]) -> None:
    for v in views:
        digester.update(v)


class LandingDigest:
    """The digest of ``parts`` (a chunk's destination), fed as its bytes land; calls
    ``done(digest)`` once every byte landed and was hashed (``done(None)`` if a worker
    thread failed), at most once and never after :meth:`cancel`."""

    def __init__(
        self,
        parts: Sequence[memoryview],
        done: Callable[[bytes | None], None],
        executor: Executor,
        off_loop: int,
    ) -> None:
        self._parts = parts
        self._size = sum(len(p) for p in parts)
        self._done = done
        self._executor = executor
        self._off_loop = off_loop
        self._digester = Digester()
        self._hashed = 0  # bytes hashed so far
        self._landed = 0  # bytes landed for good so far
        self._busy = False  # a run is being hashed on a worker thread
        self._over = False  # done was called, or cancelled

    def landed(self, upto: int) -> None:
        """Bytes ``[0, upto)`` have landed and will not change."""
        if upto > self._landed:
            self._landed = min(upto, self._size)
        self._step()

    def cancel(self) -> None:
        """The request was abandoned or failed: hash no more, never call ``done``."""
        self._over = True

    def _step(self) -> None:
        if self._busy or self._over:
            return
        upto = self._landed
        n = upto - self._hashed
        if n > 0 and n >= self._off_loop:
            views = byte_range(self._parts, self._hashed, upto)
            self._busy = True
            job = asyncio.get_running_loop().run_in_executor(
                self._executor, _update, self._digester, views
            )
            job.add_done_callback(lambda f: self._hashed_to(upto, f))
            return
        if n > 0:
            _update(self._digester, byte_range(self._parts, self._hashed, upto))
            self._hashed = upto
        if self._hashed == self._size:
            self._over = True
            self._done(self._digester.digest())

    def _hashed_to(self, upto: int, job: asyncio.Future[None]) -> None:
        self._busy = False
        if self._over:
            return
        if job.cancelled() or job.exception() is not None:
            self._over = True
            self._done(None)
            return
        self._hashed = upto
        self._step()
