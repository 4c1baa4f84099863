"""Is a relay chain's head slower than the origin could feed its downstream? Pure: ticks
are inputs.

A link judges itself lagging against its upstream (``ChunkPlanner._note_lag``), which
finds a slow link anywhere in a chain but its head: the head's upstream is the origin,
which holds everything, so the head never falls behind it; and every link after a slow
head trails it closely, so none of them falls behind either. The whole chain then runs
at the head's pace (``bench/linerate.py --case slow --victim 1``, the head's NIC at half
rate: every healthy receiver took 2.05x one copy, where the bound is 1x). Nothing in the
protocol's view tells a half-rate chain from a full-rate one: no node knows a NIC's rate.

So the link after the head measures it. It times the head's chunks as they arrive (the
chain's pace), then asks the origin for one chunk far ahead, beside the head's stream,
and times that copy:

- If the origin's uplink is what paces the chain (the head is healthy), the copy shares
  that uplink with the head's stream: it takes about two of the chain's chunk times.
- If the head is the slow one, the origin's uplink has room to spare, and the copy
  comes at about the chain's pace: about one chunk time.

Under ``SLOW_HEAD`` (1.4) of them the head is slow: the link tells it so (the node's
``Behind`` message), and the head moves to the chain's tail as a link that judged itself
lagging does; the link relays from the origin from then on. Asked once per upstream,
and only of a chain's head, the check costs a healthy chain about one chunk time and the
origin one chunk more than a model (the head later takes that chunk from the origin too,
or from the link that has it).
"""

from __future__ import annotations

from collections import deque

HEAD_CHUNKS = 4
"""The head's chunks timed before the check (their mean spacing is the chain's pace). The
verdict's delay is what a slow head costs every link after it: timing 8, the verdict
came 80 ticks in (11 chunks at half rate) and the healthy links took 1.25x one copy
(simulated, bench/linerate.py --case slow --victim 1, N=4, 256 MiB); timing 4, 1.19x.
Fewer timed chunks misjudge a head whose uplink was shared a while (the chain forming
after staggered starts) unless its pace during the probe is held against it too
(:meth:`HeadCheck.landed`)."""
HEAD_MIN_TICKS = 3
"""...at no less than this many ticks each: a chunk faster than that (a loopback, a fast
NIC at 4 MiB) is timed too coarsely to compare with one copy's time, and a fetch that
fast does not need the check. At 2 (until session 29) a healthy head at 2 Gbit/s, its
pace quantised to 2-3 ticks, was found slow in 5 of 24 simulated fetches with starts
drawn 0-4 ms apart; a head at half of 2 Gbit/s (3.4 ticks a chunk) is still checked."""
HEAD_SETTLE = 20
"""Ticks after a link began relaying from its upstream before the head's chunks are timed:
while the chain forms, links that began before their upstreams relay from the head for
a while, and the head's pace is a share of its uplink (simulated with one measured
round's starts, 3.3 ms apart: the head's first chunks came at half pace until tick 25;
timed from tick 10, a healthy head was told it was slow, 1.31x one copy, 2.0x before a
link moving to the tail gave back what it had asked; from 15, 8 healthy heads in 72
fetches with starts drawn apart, against 5 from 20)."""
HEAD_MIN_MISSING = 32
"""Chunks still missing for the check to be worth the probe's chunk time."""
HEAD_WAIT = 50
"""Ticks a link falling behind the head waits, for enough of the head's chunks to time a
probe against, before it judges itself lagging without the check (ChunkPlanner.
_head_first): seven chunks at half rate, 1 Gbit/s."""
STEADY = 1.25
"""How far the head's pace over the first half of the timed chunks may differ from the
second's (see :meth:`HeadCheck.pace`)."""
SLOW_HEAD = 1.4
"""The origin's copy took under this many of the chain's chunk times: the head is slow
(expected: 1 if it is, 2 if the origin's uplink paces the chain)."""


class HeadCheck:
    """One fetch's check of its upstream, for a link whose upstream is the chain's head.
    The planner says when chunks arrive, asks :meth:`due` before each plan, sends the
    probe it is given leave for, and reports how it ended."""

    def __init__(self, chunks: int = HEAD_CHUNKS) -> None:
        self._chunks = chunks  # timed before the probe (HEAD_CHUNKS)
        self._arrivals: deque[int] = deque(maxlen=chunks)  # ticks, from the upstream
        self._probe: tuple[str, int, int, float] | None = None  # (head, chunk, sent, pace)
        self._during: list[int] = []  # the head's last arrival before the probe, and since
        self._checked: set[str] = set()  # upstreams checked (or being checked)
        self._waiting_since: int | None = None  # a lag verdict waits for timed chunks
        self.verdicts = 0  # heads found slow (for a test or a log)

    def moved(self) -> None:
        """We relay from another upstream now: its pace is timed afresh."""
        self._arrivals.clear()

    def arrived(self, now: int) -> None:
        """A chunk from our upstream landed at tick ``now``."""
        self._arrivals.append(now)
        if self._probe is not None:
            self._during.append(now)

    def checked(self, head: str) -> bool:
        """Was ``head`` checked (or is it being checked) in this fetch?"""
        return head in self._checked

    def pace(self, falling: bool = False) -> float | None:
        """Ticks per chunk of the upstream's last ``chunks``, if timed well enough:
        each at least ``HEAD_MIN_TICKS``, and steady (the two halves within ``STEADY``
        of each other). A link ``falling`` behind its head needs half as many: it asks at
        once whose the slowness is (its own lag verdict waits on it).

        A link that just moved to this upstream shares its uplink with what the old
        downstream still has in flight there: timed then, a healthy head's pace looked
        half its own, and a probe at the origin's full share looked fast (simulated,
        bench/linerate.py --case slow --victim 2: the new head was told it was slow and
        moved to the tail, 1.37x one copy where 1.19x is the rule's)."""
        a = self._arrivals
        if len(a) < (max(3, self._chunks // 2) if falling else self._chunks):
            return None
        half = len(a) // 2
        first = (a[half] - a[0]) / half
        second = (a[-1] - a[half]) / (len(a) - 1 - half)
        per = (a[-1] - a[0]) / (len(a) - 1)
        if per < HEAD_MIN_TICKS or max(first, second) > STEADY * min(first, second):
            return None
        return per

    def due(self, head: str, falling: bool = False) -> float | None:
        """The pace to hold a probe against, if ``head`` (our upstream, the chain's head)
        is to be checked now: never checked, and its pace timed (``falling``: see
        :meth:`pace`)."""
        if self._probe is not None or head in self._checked:
            return None
        return self.pace(falling)

    def waiting_since(self, now: int) -> int:
        """The tick a lag verdict began to wait on this check (the first time it asked:
        ``now`` then)."""
        if self._waiting_since is None:
            self._waiting_since = now
        return self._waiting_since

    def skip(self, head: str) -> None:
        """``head`` will not be checked in this fetch (no probe could be asked: no origin
        with room, no chunk far enough ahead): a lag verdict that waits on the check
        (ChunkPlanner._head_first) goes ahead."""
        self._checked.add(head)

    def sent(self, head: str, chunk: int, now: int, pace: float) -> None:
        """The probe for ``chunk`` went to the origin at tick ``now``."""
        self._checked.add(head)
        self._probe = (head, chunk, now, pace)
        self._during = [self._arrivals[-1] if self._arrivals else now]

    def landed(self, chunk: int, now: int) -> str | None:
        """``chunk`` landed at tick ``now``: the head found slow, if it was the probe and
        came within ``SLOW_HEAD`` of the head's pace both before the probe and while it was
        out. A slow head keeps its pace while the probe is out (the origin's uplink had
        room for both); a head whose pace before was held down by something that has
        passed (its uplink shared while the chain formed) comes faster meanwhile, and is
        cleared."""
        probe = self._probe
        if probe is None or probe[1] != chunk:
            return None
        self._probe = None
        head, _, sent, pace = probe
        if now - sent < SLOW_HEAD * min(pace, self._pace_during(now)):
            self.verdicts += 1
            return head
        return None

    def _pace_during(self, now: int) -> float:
        """Ticks per chunk of the head while the probe was out, from its last chunk before
        the probe; with none since, the time since that one (its pace is no faster)."""
        d = self._during
        return (d[-1] - d[0]) / (len(d) - 1) if len(d) > 1 else float(now - d[0])

    def failed(self, chunk: int) -> None:
        """The probe for ``chunk`` (if it was one) got no copy: no verdict."""
        if self._probe is not None and self._probe[1] == chunk:
            self._probe = None

    @property
    def probing(self) -> int | None:
        """The chunk a probe is out for, if one is."""
        return None if self._probe is None else self._probe[1]
