"""A cumulative histogram of durations, as Prometheus exposes one (pure, no clock).

Why not prometheus_client's own ``Histogram``: it registers process-wide, and several Hubs
in one process (tests, the simulator) must not share counts. This keeps counts per Hub; the
HTTP layer turns them into a metric family at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: from a small version on a LAN to a 100+ GB model across a WAN."""

CHUNK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds for one chunk request, issued to verified."""


@dataclass
class Histogram:
    buckets: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, the last is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def merge(self, other: Histogram) -> None:
        if other.buckets != self.buckets:
            raise ValueError("histograms with different buckets")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.n += other.n

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations ≤ it) pairs, "+Inf" last, as Prometheus wants them."""
        out, running = [], 0
        for bound, c in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += c
            out.append((bound, running))
        return out
