"""Chunk and manifest digests: xxh3-128.

xxh3 hashes at ~30 GB/s on one core here, ten times the loopback copy rate, so every chunk
can be verified on the hot path. It guards against corruption, bugs and stale holders; it
is not a defence against a malicious peer that holds the cluster secret.
"""

from __future__ import annotations

from collections.abc import Iterable

import xxhash

from ..typing import Buffer

DIGEST_SIZE = 16


def digest(data: Buffer) -> bytes:
    """xxh3-128 of one contiguous buffer."""
    return bytes(xxhash.xxh3_128_digest(data))


def digest_parts(parts: Iterable[Buffer]) -> bytes:
    """xxh3-128 of the concatenation of ``parts``, without concatenating them."""
    h = xxhash.xxh3_128()
    for part in parts:
        h.update(part)
    return bytes(h.digest())
