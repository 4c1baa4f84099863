"""Is a relay link's own stream steadily slower than its upstream gains chunks? Pure:
ticks are inputs.

A link judges itself lagging once it fell ``LAG_FALL`` further behind its upstream and
then, in a look of ``RELAY_START_WAIT`` ticks and ``LAG_WATCH_CHUNKS`` of the upstream's
chunks, kept falling behind (``ChunkPlanner._note_lag``). The look is there because a fall
alone cannot tell a slow NIC from a host that did not run the process for a while: both
leave the link behind, but after a stall the gap stops growing. Until the verdict every
link after the slow one relays at its pace, and the look is 0.2 s of that: at N=8 with
r5 at half rate, the verdict came at 0.57 s, and the links after r5 ended as many chunk
times late as they held fewer chunks than r4 then (bench/linerate.py --case slow,
traced in session 47; docs/results.md).

The shape of the link's own arrivals tells the two apart sooner. A link on a slow NIC
gets its upstream's chunks one after another, each taking the same long time (a
half-rate link: 68 ms apart where its upstream gains one every 34, from its second chunk
on). A stalled process gets them in a burst after a gap: its intervals are uneven. So
when the fall that begins the look is reached, and the link's last ``PACE_CHUNKS``
intervals are even (within ``PACE_STEADY`` of each other) while its upstream gained at
least ``PACE_RATIO`` times as many chunks over the same ticks, the look has nothing
left to show and the verdict is due now. The look runs all the same (``ChunkPlanner.
_look``): this only ever brings a verdict forward.

Measured (session 48, docs/results.md), a job's first step with a half-rate link,
alternated round by round with the rule off (``node:planner.pace_verdict=false``): N=8,
r5 at half rate, 1.170x one copy against 1.202x (27 rounds each, 4 over 1.2x against
15); N=4, r3 at half rate, 1.138x against 1.161x (6). Applied to the traces on record of
sessions 38-47, the rule finds the half-rate link 0.10-0.36 s (median 0.14) before its
verdict did in 37 of 39 rounds, and no link of a healthy round; on a host that starves
a healthy relay steadily it judges it as the look does, only sooner. Simulated
(``sim/fanout.py``, the same planner): N=8 1.117x → 1.088x, N=4 1.117x → 1.081x;
healthy chains unchanged.

Off by default from session 48 to 50 (``PlannerConfig.pace_verdict``): in the first step
of one later round two healthy links after the slow one were judged lagging, 10 chunks
in, and the lag memory kept them behind it in the next step (2.26x one copy).

Sessions 49 and 50 traced such verdicts (docs/results.md): each was a healthy link that
really got its chunks steadily slower, or fell behind for a while, for a cause outside
its NIC, each now fixed: a remembered laggard that passed over the tail as not begun
(``ChunkPlanner._begun``, ``_passed_over``), so two links shared an uplink; a link whose
view of its datacenter lacked a live member and relayed past it (a bench step begun
before the members' gossip settled; bench/linerate.py waits now); and a link that moved
on to a new upstream mid-fetch and knew that upstream's chunks only up to a hole (what it
held before the first ask reached the link by gossip alone), so it asked nothing for 0.3
s while its upstream was 8 chunks ahead (``ChunkPlanner.received``,
``PeerHandler._tell_held``). On by default since: 1.150x one copy against 1.226x with
the look alone, both in each of 22 rounds, and no healthy link judged with it.
"""

from __future__ import annotations

import itertools
from collections import deque

PACE_CHUNKS = 4
"""Intervals between our last chunks from the upstream that are timed (five arrivals):
at half of 1 Gbit/s, 0.27 s of chunks, about what the fall of ``LAG_FALL`` takes."""
PACE_RATIO = 1.6
"""How many more chunks the upstream must have gained than we did over those intervals (2
for a link at half rate; a link at 3/4 rate, 1.33, is left to the look)."""
PACE_STEADY = 1.5
"""How much longer our longest interval of those may be than our shortest. A link at half
rate of 1 Gbit/s gets a 4 MiB chunk every 6-7 ticks; a stall (a busy host) shows as one
long interval among short ones (the socket buffer's backlog read at once)."""
PACE_MIN_TICKS = 3
"""...and our shortest interval at least this many ticks: a faster stream is timed too
coarsely in 10 ms ticks to call steady (as ``headcheck.HEAD_MIN_TICKS``)."""


class PaceWatch:
    """Our arrivals from our current upstream, with how far the upstream had got at each.
    The planner says when a chunk from the upstream lands (:meth:`arrived`), when we move
    to another upstream (:meth:`moved`) or stalled (:meth:`stalled`), and asks
    :meth:`slow` before a lag look begins or goes on."""

    def __init__(self, chunks: int = PACE_CHUNKS) -> None:
        self._arrivals: deque[tuple[int, int]] = deque(maxlen=chunks + 1)  # (tick, its count)
        self.verdicts = 0  # lag verdicts this brought forward (for a test or a trace)

    def moved(self) -> None:
        """We relay from another upstream now (or afresh): timed anew."""
        self._arrivals.clear()

    def stalled(self) -> None:
        """Our process did not run for a while: intervals spanning that say nothing of our
        NIC."""
        self._arrivals.clear()

    def arrived(self, now: int, up_count: int) -> None:
        """A chunk from our upstream landed at tick ``now``; the upstream held ``up_count``
        chunks then, as far as we know."""
        self._arrivals.append((now, up_count))

    def slow(self) -> bool:
        """Are our last ``PACE_CHUNKS`` intervals steady, each at least ``PACE_MIN_TICKS``,
        while the upstream gained ``PACE_RATIO`` times as many chunks?"""
        a = self._arrivals
        if a.maxlen is None or len(a) < a.maxlen:
            return False
        ticks = [t for t, _ in a]
        gaps = [t1 - t0 for t0, t1 in itertools.pairwise(ticks)]
        short = min(gaps)
        if short < PACE_MIN_TICKS or max(gaps) > PACE_STEADY * short:
            return False
        return a[-1][1] - a[0][1] >= PACE_RATIO * len(gaps)
