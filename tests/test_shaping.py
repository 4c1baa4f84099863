"""WAN emulation: the token bucket's arithmetic, and shaping on a real cross-DC fetch."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.shaping import TokenBucket
from tensorhub.io.shaping import Link
from tensorhub.io.tensors import empty_like_manifest

from .test_hub import cluster, weights


def test_bucket_passes_a_burst_then_meters_at_rate() -> None:
    b = TokenBucket(rate=100.0, burst=50.0)
    assert b.reserve(0.0, 50) == 0.0  # the burst
    assert b.reserve(0.0, 100) == 1.0  # 100 bytes of debt at 100 B/s
    assert b.reserve(1.0, 100) == 1.0  # the debt was paid at t=1; this one waits in turn
    assert b.reserve(10.0, 10) == 0.0  # idle time refills, up to the burst


@given(st.lists(st.tuples(st.floats(0, 1), st.integers(1, 500)), min_size=1, max_size=50))
def test_property_never_faster_than_rate_plus_burst(steps: list[tuple[float, int]]) -> None:
    """However sends are spaced, by the time each may leave, the bytes sent so far are at
    most burst + rate x elapsed."""
    rate, burst = 1000.0, 200.0
    b = TokenBucket(rate, burst)
    now, sent = 0.0, 0
    for gap, n in steps:
        now += gap
        leave = now + b.reserve(now, n)
        sent += n
        assert sent <= burst + rate * leave + 1e-6


async def test_cross_dc_fetch_is_held_to_the_link_and_local_is_not(tmp_path: Path) -> None:
    rate = 16e6  # bytes/s of the emulated link
    async with cluster(tmp_path, rollouts=2) as (voters, (near, far)):
        # voter0 (dc0) publishes; rollout0 is in dc0, rollout1 in dc1.
        for h in (*voters, near, far):
            h.emulate_wan({"dc1" if h.locality.startswith("dc0") else "dc0": Link(rate, 0.005)})
        voters[0].super_seed_after = None  # a plain holder: the far fetch must cross the link
        pub = await voters[0].publish("policy", 1, weights(1, mib=8), chunk_size=1 << 20)
        t0 = time.monotonic()
        await far.fetch("policy", 1, empty_like_manifest(pub.manifest))
        shaped = time.monotonic() - t0
        size = pub.manifest.total_bytes
        print(f"cross-DC fetch of {size / 2**20:.1f} MiB at {rate / 1e6:.0f} MB/s: {shaped:.2f}s")
        assert shaped >= 0.8 * (size - (1 << 20)) / rate  # the link's rate, less one burst
        t0 = time.monotonic()
        await near.fetch("policy", 1, empty_like_manifest(pub.manifest))
        local = time.monotonic() - t0
        assert local < shaped  # same datacenter: not shaped
