"""A chunk hashed as its bytes land: the same digest as hashing it whole, whatever runs the
bytes land in and wherever each run is hashed (inline or on a worker thread), reported once,
and not at all once cancelled."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import pytest

from tensorhub.core.digest import digest_parts
from tensorhub.dataplane.landing_digest import LandingDigest

_pool = ThreadPoolExecutor(2, "test-landing-digest")


def _parts(rng: random.Random, sizes: list[int]) -> list[memoryview]:
    return [memoryview(bytearray(rng.randbytes(n))) for n in sizes]


async def _until(cond: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    while not cond():
        assert loop.time() < give_up, "not done in time"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("seed", range(40))
async def test_the_digest_of_runs_as_they_land_is_the_digest_of_the_whole(seed: int) -> None:
    """Random part sizes (a chunk across tensors), random runs, off-loop thresholds from
    "every run on a thread" to "every run inline"."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    parts = _parts(rng, [rng.choice([0, 1, 63, 4096, 100_000, 300_000]) for _ in range(4)])
    size = sum(len(p) for p in parts)
    got: list[bytes | None] = []
    off_loop = rng.choice([1, 4096, 65536, 1 << 30])
    d = LandingDigest(parts, got.append, _pool, off_loop)
    landed = 0
    while landed < size:
        landed = min(size, landed + rng.choice([1, 500, 4096, 70_000, size]))
        d.landed(landed)
        if rng.random() < 0.5:
            await asyncio.sleep(0)  # (a thread's run may finish between two runs, or not)
    d.landed(size)  # (the payload's end is reported again: harmless)
    await _until(lambda: got)
    await asyncio.sleep(0.01)
    assert got == [digest_parts(parts)]


async def test_a_run_shorter_than_the_threshold_is_verified_at_once() -> None:
    """The point of it: once the last byte lands, only that run is left to hash, inline,
    so the chunk is verified before the event loop runs anything else."""
    parts = _parts(random.Random(1), [4 << 20])
    got: list[bytes | None] = []
    d = LandingDigest(parts, got.append, _pool, 1 << 20)
    for upto in range(256 << 10, (4 << 20) + 1, 256 << 10):
        d.landed(upto)
    assert got == [digest_parts(parts)]


async def test_a_cancelled_digest_never_reports_though_a_thread_was_hashing() -> None:
    parts = _parts(random.Random(2), [8 << 20])
    got: list[bytes | None] = []
    d = LandingDigest(parts, got.append, _pool, 1)
    d.landed(4 << 20)  # on a thread now
    d.cancel()
    d.landed(8 << 20)
    await asyncio.sleep(0.2)
    assert got == []


class _Failing(Executor):
    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_exception(OSError("the worker thread failed"))
        return f


async def test_a_failed_worker_reports_no_digest() -> None:
    """The request then fails as corrupt (PeerHandler._verified compares None)."""
    parts = _parts(random.Random(3), [1 << 20])
    got: list[bytes | None] = []
    d = LandingDigest(parts, got.append, _Failing(), 1)
    d.landed(1 << 20)
    await _until(lambda: got)
    assert got == [None]


def test_an_empty_chunk_is_reported_at_once() -> None:
    got: list[bytes | None] = []
    LandingDigest([], got.append, _pool, 1 << 20).landed(0)
    assert got == [digest_parts([])]
