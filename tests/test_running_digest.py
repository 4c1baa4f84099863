"""A chunk hashed as its pieces land (``core.digest.RunningDigest``,
``dataplane.peer.PeerHandler._hash_piece``) has the digest of the chunk hashed whole, however
it was cut and whichever pieces came too fast to hash on the event loop."""

from __future__ import annotations

import os
import random
from typing import Any, cast

import pytest

from tensorhub.core.digest import RunningDigest, digest_parts
from tensorhub.dataplane import peer as peer_module
from tensorhub.dataplane.peer import PeerHandler, _Request, byte_range

KIB = 1 << 10


def _chunk(rng: random.Random, size: int) -> list[memoryview]:
    """``size`` random bytes in a few parts of random lengths, as a chunk across tensors."""
    data = rng.randbytes(size)
    cuts = sorted(rng.sample(range(1, size), 3))
    ends = zip([0, *cuts], [*cuts, size], strict=True)
    return [memoryview(bytearray(data[a:b])) for a, b in ends]


def test_fed_in_any_pieces_the_digest_is_the_whole_chunks() -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(20):
        size = rng.randrange(1, 3 << 20)
        parts = _chunk(rng, max(size, 4))
        size = sum(len(p) for p in parts)
        running, pos = RunningDigest(), 0
        while pos < size:
            step = rng.randrange(0, 700 * KIB)  # (empty pieces too)
            running.update(byte_range(parts, pos, min(size, pos + step)))
            pos = running.fed
        assert running.fed == size
        assert running.digest() == digest_parts(parts)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _request(parts: list[memoryview]) -> _Request:
    """A chunk request whose payload began at time 0."""
    req = _Request(fut=cast(Any, None), parts=parts)
    req.digest, req.began = RunningDigest(), 0.0
    return req


def test_pieces_are_hashed_as_they_land_while_the_chunk_comes_slowly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk's first 512 KiB land at 5 GB/s (too fast: left); by the time 1 MiB is in
    the chunk has come at 20 MB/s, and the backlog of 1 MiB is hashed at once (a busy
    process reads what queued meanwhile in a burst); then 1.5 MiB more at once is more
    than the loop hashes in one go, left for the end, where the rest is hashed from
    there. The digest is the chunk's."""
    clock = _Clock()
    monkeypatch.setattr(peer_module, "time", clock)
    size = 4 << 20
    parts = _chunk(random.Random(7), size)
    req = _request(parts)
    steps = []
    for at, landed in ((0.0001, 512 * KIB), (0.05, 1 << 20), (0.051, 5 << 19)):
        clock.now = at
        steps.append((PeerHandler._hash_piece(req, landed), req.digest.fed if req.digest else -1))
    assert steps == [(False, 0), (True, 1 << 20), (False, 1 << 20)]
    assert req.digest is not None
    assert req.digest.finish(byte_range(parts, req.digest.fed, size)) == digest_parts(parts)


def test_a_chunk_coming_faster_than_the_inline_rate_is_left_to_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(peer_module, "time", clock)
    req = _request(_chunk(random.Random(8), 4 << 20))
    clock.now = 0.001  # 512 KiB a millisecond: 500 MB/s
    assert not PeerHandler._hash_piece(req, 512 * KIB)
    clock.now = 0.01  # 51 MB/s since it began
    assert PeerHandler._hash_piece(req, 512 * KIB)
    assert req.digest is not None and req.digest.fed == 512 * KIB
