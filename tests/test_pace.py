"""The pace verdict (``tensorhub/core/swarm/pace.py``): a relay link whose own chunks come
steadily slower than its upstream gains chunks is judged lagging when it has fallen
``LAG_FALL`` behind, without the look that tells a slow NIC from a stalled process. The
rule alone, then in the planner (earlier for a slow link; never for a stalled one), then
in the simulator's fan-out it was built for."""

from __future__ import annotations

import random
import statistics

from sim.fanout import predict_each
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig
from tensorhub.core.swarm.pace import PACE_CHUNKS, PACE_MIN_TICKS, PaceWatch
from tensorhub.core.swarm.presets import preset

MiB = 1 << 20


def _fed(watch: PaceWatch, ticks: list[int], its: list[int]) -> PaceWatch:
    for t, c in zip(ticks, its, strict=True):
        watch.arrived(t, c)
    return watch


def _steady(every: int, its_per_ours: float, start: int = 100) -> tuple[list[int], list[int]]:
    """PACE_CHUNKS + 1 arrivals ``every`` ticks apart, the upstream gaining
    ``its_per_ours`` chunks for each of ours."""
    n = PACE_CHUNKS + 1
    return [start + i * every for i in range(n)], [10 + round(i * its_per_ours) for i in range(n)]


# -- the rule --------------------------------------------------------------------------------


def test_steady_arrivals_at_half_the_upstreams_pace_are_slow() -> None:
    assert _fed(PaceWatch(), *_steady(7, 2.0)).slow()


def test_too_few_arrivals_say_nothing() -> None:
    ticks, its = _steady(7, 2.0)
    assert not _fed(PaceWatch(), ticks[:-1], its[:-1]).slow()


def test_a_stall_among_the_arrivals_is_not_a_pace() -> None:
    """A process that did not run gets the chunks queued meanwhile at once: one long
    interval among short ones, however far its upstream got."""
    ticks = [100, 104, 108, 130, 134]  # (each at least PACE_MIN_TICKS: uneven alone)
    assert not _fed(PaceWatch(), ticks, [10, 11, 12, 19, 20]).slow()


def test_a_link_a_little_slower_than_its_upstream_is_left_to_the_look() -> None:
    assert not _fed(PaceWatch(), *_steady(4, 1.25)).slow()


def test_a_pace_too_fast_for_ticks_is_not_judged() -> None:
    assert not _fed(PaceWatch(), *_steady(PACE_MIN_TICKS - 1, 2.0)).slow()


def test_a_new_upstream_or_a_stall_times_afresh() -> None:
    for forget in (PaceWatch.moved, PaceWatch.stalled):
        watch = _fed(PaceWatch(), *_steady(7, 2.0))
        forget(watch)
        assert not watch.slow()
        assert _fed(watch, *_steady(7, 2.0, start=200)).slow()


# -- in the planner --------------------------------------------------------------------------


def _n5(pace: bool) -> ChunkPlanner:
    """n5 of a chain origin > n1 .. n8, relaying from n4 (as tests/test_planner.py)."""
    cfg = PlannerConfig(relay=True, relay_min_chunks=1, per_source=4, pace_verdict=pace)
    p = ChunkPlanner("n5", 256, random.Random(0), cfg)
    p.set_source("origin", 1, range(256), origin=True)
    for name in ("n1", "n2", "n3", "n6", "n7", "n8"):
        p.set_source(name, 1, [])
    p.set_source("n4", 1, [0])
    return p


def _judged(
    pace: bool, its_every: int, ours: list[int], steps: int = 400, stall: range = range(0)
) -> int | None:
    """n5 relays from n4, which gains a chunk every ``its_every`` ticks (and tells us at
    once); one of ours lands at each tick in ``ours`` (the first request in flight). In
    the ticks of ``stall`` its process does not run (it hears and asks nothing), and its
    driver tells it so after (FetchSession.stalled). The tick n5 judged itself lagging,
    or None."""
    p, upstream, inflight, lands = _n5(pace), 1, [], set(ours)
    for step in range(steps):
        if step % its_every == 0:
            upstream += 1
        if step in stall:
            p.tick()
            continue
        if stall and step == stall.stop:
            p.stalled()
        p.set_source("n4", 1, range(min(p.num_chunks, upstream)))
        inflight += p.next_requests()
        if step in lands and inflight:
            r = inflight.pop(0)
            p.received(r.chunk, r.source)
        p.tick()
        if p.lagging:
            return step
    assert not p.done  # (the judgement ran all along)
    return None


def test_a_half_rate_link_is_judged_at_its_fall_without_the_look() -> None:
    """bench/linerate.py --case slow, traced (session 47): r5 at half rate reached the
    fall that begins the look at 0.31-0.38 s and was judged after the look, at 0.57 s; its
    chunks came 68 ms apart from its second on, its upstream's 34. Here n4 gains a chunk
    every 3 ticks and n5 lands one every 6: judged once its fifth chunk timed the pace (tick
    31), where the look that the fall began ends 14 ticks later."""
    ours = list(range(6, 400, 6))
    looked, paced = _judged(False, 3, ours), _judged(True, 3, ours)
    assert looked is not None and paced is not None, (looked, paced)
    assert paced + 10 <= looked, (paced, looked)


def test_a_link_that_stalled_once_is_not_judged_by_its_pace() -> None:
    """A busy host does not run a healthy link for 60 ticks: it falls 20 chunks behind,
    then reads what queued meanwhile at once (a chunk a tick) and goes on at its
    upstream's pace. The burst is no pace, and a link that is slow is still judged through
    the same stall."""
    stall = range(60, 120)
    healthy = [t for t in range(3, 400, 3) if t < 60] + list(range(120, 140))
    healthy += list(range(141, 400, 3))
    assert _judged(True, 3, healthy, stall=stall) is None
    slow = [t for t in range(6, 400, 6) if t not in stall]
    judged = _judged(True, 3, slow, stall=stall)
    assert judged is not None and judged < 60, judged


def test_a_link_keeping_pace_is_never_judged() -> None:
    assert _judged(True, 3, list(range(3, 400, 3))) is None


# -- simulated -------------------------------------------------------------------------------


def test_the_simulated_first_step_with_a_half_rate_link_ends_sooner() -> None:
    """sim/fanout.py, N=8 with r5 at half rate, 256 MiB at 1 Gbit/s: the links after r5
    relay at its pace until its verdict, so a verdict a look sooner is theirs to keep
    (1.117x one copy without, 1.088x with, seeds 1-3 when it was built); a healthy chain
    is not touched. On by default (``PlannerConfig.pace_verdict``)."""

    def last_healthy(name: str, rates: dict[int, float]) -> float:
        runs = [predict_each(8, 256 * MiB, 1000, 4 * MiB, preset(name), s, rates) for s in (1, 2)]
        return statistics.median(
            max(v for i, v in enumerate(each, 1) if i not in rates) for each in runs
        )

    off = "node:planner.pace_verdict=false"
    slow = {5: 500.0}
    assert last_healthy("node", slow) < last_healthy(off, slow) - 0.015
    assert last_healthy("node", {}) == last_healthy(off, {})
