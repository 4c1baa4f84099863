"""The head check (``tensorhub/core/swarm/headcheck.py``): the link after a relay chain's
head times the head's pace, asks the origin for one chunk far ahead beside it, and tells
a head that proves slower than the origin could feed it (``Behind``) to move to the
chain's tail. Pure rules first, then the planner's use of them, the simulated fan-out it
was built for, and the message between two real nodes."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time

import torch

from tensorhub.core.manifest import Manifest
from tensorhub.core.naming import ShardKey
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig, Request
from tensorhub.core.swarm.headcheck import HEAD_CHUNKS, HeadCheck
from tensorhub.core.swarm.presets import NODE, RELAY
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.peer import PeerHandler
from tensorhub.dataplane.store import Replica
from tensorhub.dataplane.swarm import swarm_fill
from tensorhub.dataplane.view import Holder
from tensorhub.io.shaping import Link, WanShaper
from tensorhub.io.tensors import TensorBytes, empty_like_manifest

from .models import same_bytes
from .transports import routed

SECRET = b"head-check-secret"


def _timed(check: HeadCheck, every: float, start: int = 100) -> None:
    for i in range(HEAD_CHUNKS):
        check.arrived(start + round(i * every))


# -- the rule --------------------------------------------------------------------------------


def test_a_probe_that_comes_at_the_chains_pace_finds_the_head_slow() -> None:
    check = HeadCheck()
    _timed(check, 7.0)  # the head's chunks, 7 ticks apart
    pace = check.due("a")
    assert pace is not None and abs(pace - 7.0) < 0.2
    check.sent("a", 63, 150, pace)
    assert check.probing == 63
    assert check.landed(62, 157) is None  # (not the probe)
    assert check.landed(63, 157) == "a"  # one chain chunk time: the origin had room
    assert check.verdicts == 1 and check.probing is None
    assert check.due("a") is None  # once per head


def test_a_probe_that_shares_the_origins_uplink_clears_the_head() -> None:
    check = HeadCheck()
    _timed(check, 3.4)
    pace = check.due("a")
    assert pace is not None
    check.sent("a", 63, 150, pace)
    assert check.landed(63, 157) is None  # two chunk times: the origin's uplink paced it
    assert check.verdicts == 0 and check.due("a") is None


def test_a_head_that_comes_faster_while_the_probe_is_out_is_cleared() -> None:
    """Its pace before the probe was held down by something that passed (its uplink shared
    with a link that relayed from it while the chain formed): the probe came at that pace,
    but so did two of the head's chunks in half the time meanwhile. A slow head keeps its
    pace then (the origin's uplink had room for both)."""
    shared = HeadCheck()
    _timed(shared, 7.0)  # 100, 107, 114, 121
    pace = shared.due("a")
    assert pace is not None
    shared.sent("a", 63, 122, pace)
    shared.arrived(125)
    shared.arrived(128)
    assert shared.landed(63, 129) is None and shared.verdicts == 0
    slow = HeadCheck()
    _timed(slow, 7.0)
    pace = slow.due("a")
    assert pace is not None
    slow.sent("a", 63, 122, pace)
    slow.arrived(128)
    assert slow.landed(63, 129) == "a"  # 7 ticks a chunk before and meanwhile


def test_no_probe_on_an_unsteady_pace_a_fast_one_or_a_failed_one() -> None:
    settling = HeadCheck()
    for i in range(HEAD_CHUNKS):  # a link that just moved: slow, then not
        half = HEAD_CHUNKS // 2
        settling.arrived(10 * i if i <= half else 10 * half + 3 * (i - half))
    assert settling.pace() is None
    fast = HeadCheck()
    _timed(fast, 1.0)  # a loopback: a chunk a tick, timed too coarsely to compare
    assert fast.due("a") is None
    failed = HeadCheck()
    _timed(failed, 7.0)
    pace = failed.due("a")
    assert pace is not None
    failed.sent("a", 63, 150, pace)
    failed.failed(63)  # refused, lost: no verdict, and no second probe of that head
    assert failed.landed(63, 151) is None and failed.due("a") is None
    moved = HeadCheck()
    _timed(moved, 7.0)
    moved.moved()
    assert moved.due("a") is None  # a new upstream is timed afresh


# -- the planner -----------------------------------------------------------------------------


def _second_link(config: PlannerConfig = NODE.planner) -> ChunkPlanner:
    """Link "b" of a chain o -> a -> b (64 chunks): its upstream "a" is the head."""
    p = ChunkPlanner("b", 64, random.Random(1), config)
    p.set_source("o", 1, None, origin=True)
    p.set_source("a", 1, [])
    p.set_dc_fetchers(["a", "b"])
    return p


def _relay_from_head(p: ChunkPlanner, gap: int, chunks: int = 12, first: int = 0) -> list[int]:
    """Feed ``p`` the head's chunks ``gap`` ticks apart, as a relay would get them, until
    it asks the origin for something (or ``chunks`` came); what it asked the origin for."""
    asked: list[int] = []
    for c in range(first, first + chunks):
        for _ in range(gap):
            p.tick()
            asked += [r.chunk for r in p.next_requests() if r.source == "o"]
        p.add_chunk("a", c)
        p.received(c, "a")
        asked += [r.chunk for r in p.next_requests() if r.source == "o"]
        if asked:
            break
    return asked


def test_the_second_link_probes_the_origin_once_for_a_chunk_far_ahead() -> None:
    p = _second_link()
    asked = _relay_from_head(p, 7)
    asked += _relay_from_head(p, 7, 20, first=sum(p.have))
    # The last but one (the last may be short, and come fast whatever the head), once.
    assert asked == [62], asked
    # The origin counts us no recipient of it (it would send the head to us for it).
    assert not p.onward(Request("o", 62, False)) and p.onward(Request("a", 12, False))


def test_no_probe_with_the_check_off() -> None:
    p = _second_link(dataclasses.replace(NODE.planner, head_check=False))
    assert _relay_from_head(p, 7, 20) == []


def test_a_fast_probe_tells_the_head_and_the_link_relays_from_the_origin() -> None:
    """The verdict: the head is told (``behind``), what we asked it for is taken back (at
    its pace it would hold the chain after us; the origin now serves it), and we relay
    from the origin. The session puts Behind before the requests that follow it: the
    origin must hear who is behind before it is asked again."""
    from tensorhub.core.swarm.session import Abandon, Behind, FetchSession, Send

    p = _second_link()
    session = FetchSession(p)
    asked: list[int] = []
    for c in range(20):
        for _ in range(7):
            p.tick()
            asked += [a.request.chunk for a in session.requests(0.0) if isinstance(a, Send)]
            if 62 in asked:
                break
        if 62 in asked:
            break
        p.add_chunk("a", c)
        for r in list(session.phase):
            if r.chunk == c:
                session.verified(r)
    assert 62 in asked
    held = sum(p.have)
    at_head = {r.chunk for r in session.phase if r.source == "a"}
    assert at_head  # (parked there, ahead of the head's stream)
    for _ in range(7):
        p.tick()
    probe = next(r for r in session.phase if r.chunk == 62)
    session.verified(probe)
    actions = session.requests(0.0)
    kinds = [type(a).__name__ for a in actions]
    assert {a.request.chunk for a in actions if isinstance(a, Abandon)} == at_head
    assert kinds.index("Behind") < kinds.index("Send"), kinds
    assert [a.source for a in actions if isinstance(a, Behind)] == ["a"]
    assert {a.request.source for a in actions if isinstance(a, Send)} == {"o"}
    assert p._relay_up == "o" and sum(p.have) == held + 1  # (the head is a laggard to us)


def test_a_slow_probe_tells_no_one() -> None:
    p = _second_link()
    _relay_from_head(p, 4)
    for _ in range(9):
        p.tick()
    p.received(62, "o")
    assert p.behind() == []


def _falling_behind(p: ChunkPlanner, rounds: int = 32) -> list[int]:
    """The head gains two chunks for each we receive from it; what we ask the origin."""
    asked: list[int] = []
    for i in range(rounds):
        for _ in range(7):
            p.tick()
            asked += [r.chunk for r in p.next_requests() if r.source == "o"]
        for c in (2 * i, 2 * i + 1):
            p.add_chunk("a", c)
        p.received(i, "a")
        asked += [r.chunk for r in p.next_requests() if r.source == "o"]
        if p.lagging:
            break
    return asked


def test_a_link_falling_behind_the_head_judges_itself_once_no_check_can_run() -> None:
    """A link falling behind the head waits on the head check before it judges itself
    lagging; where no probe can be asked (the origin backed off), the verdict goes ahead
    instead of waiting for ever."""
    p = _second_link()
    p.suspend("o", 10_000)
    assert _falling_behind(p) == [] and p.lagging
    checked = _second_link()
    asked = _falling_behind(checked)
    assert asked and not checked.lagging  # (the probe is out: the verdict waits on it)


def test_only_a_head_moves_when_told() -> None:
    head = ChunkPlanner("a", 64, random.Random(1), NODE.planner)
    head.set_source("o", 1, None, origin=True)
    head.set_dc_fetchers(["a", "b"])
    head.next_requests()
    assert head.told_behind() and head.lagging
    second = _second_link()
    _relay_from_head(second, 7)
    assert not second.told_behind() and not second.lagging  # (it relays from a link)


def test_a_head_told_behind_gives_back_what_it_asked_the_origin() -> None:
    """Left asked, those chunks came at the slow head's pace and took half the origin's
    uplink from the link that relays from the origin now (measured: the head got 12
    chunks from the origin where it had relayed 7). ``lag_gives_back=false`` keeps them."""
    for gives_back in (True, False):
        cfg = dataclasses.replace(NODE.planner, lag_gives_back=gives_back)
        head = ChunkPlanner("a", 64, random.Random(1), cfg)
        head.set_source("o", 1, None, origin=True)
        head.set_dc_fetchers(["a", "b"])
        asked = {r.chunk for r in head.next_requests() if r.source == "o"}
        assert asked and head.inflight == len(asked)
        assert head.told_behind()
        back = head.taken_back()
        if gives_back:
            assert {r.chunk for r in back} == asked and all(r.source == "o" for r in back)
            assert head.inflight == 0
        else:
            assert back == [] and head.inflight == len(asked)


def test_a_link_judging_itself_lagging_gives_back_what_it_asked_its_upstream() -> None:
    """Chain o -> a -> b -> c; b falls behind a and moves to the tail, after c: what it
    had asked a for is taken back (a's uplink is c's now), and b asks a nothing more."""
    p = _second_link()
    p.set_source("c", 1, [])
    p.set_dc_fetchers(["a", "b", "c"])
    p.suspend("o", 10_000)  # (no head check: the verdict is the link's own)
    _falling_behind(p)
    assert p.lagging
    back = p.taken_back()
    assert back and all(r.source == "a" for r in back)
    assert p.sources["a"].inflight == 0  # none left asked


def test_a_laggard_still_relaying_from_its_upstream_gives_nothing_back() -> None:
    """Chain o -> a -> b: b falls behind a and moves to the tail, which is a: it relays
    from a still, and what it asked a stays asked (given back, the same chunks were asked
    again at once, cut and sent twice)."""
    p = _second_link()
    p.suspend("o", 10_000)
    _falling_behind(p)
    assert p.lagging and p.taken_back() == []
    assert p.sources["a"].inflight > 0


def test_a_chunk_held_alone_ahead_is_not_how_far_a_link_got() -> None:
    p = _second_link()
    for c in (0, 1, 2, 63):
        p.add_chunk("a", c)
    assert p.sources["a"].top == 2
    p.set_source("a", 1, [0, 1, 2, 3, 4, 40, 63])
    assert p.sources["a"].top == 4
    p.add_chunk("a", 62)  # 63 has a predecessor now
    assert p.sources["a"].top == 63


# -- the simulated fan-out ---------------------------------------------------------------------


def test_a_half_rate_chain_head_no_longer_holds_every_link_to_its_pace() -> None:
    """bench/linerate.py --case slow --victim 1, simulated: before the head check every
    healthy receiver took 2.00x one copy (measured: 2.05x). Timing 8 of the head's chunks
    (session 28) the second link found the head slow 11 chunks in: 1.25x (1 GiB: 1.07x);
    timing 4, 1.19x; and with the head giving back what it had asked the origin for,
    1.13x (1 GiB: 1.03x)."""
    from sim.fanout import predict_each

    for size, bound in ((256 << 20, 1.15), (1 << 30, 1.05)):
        times = predict_each(8, size, 1000.0, 4 << 20, NODE, seed=1, rates={1: 500.0})
        print(size >> 20, "MiB, each receiver / one copy:", [round(t, 3) for t in times])
        assert max(times[1:]) < bound
        assert times[0] / 2 < 1.05  # the head itself at its own rate


def test_a_healthy_chain_pays_one_chunk_time_for_the_check() -> None:
    from sim.fanout import predict_each

    times = predict_each(8, 256 << 20, 1000.0, 4 << 20, NODE, seed=1)
    print("each receiver / one copy:", [round(t, 3) for t in times])
    assert max(times) < 1.003 + 1.5 / 64


# -- two real nodes ----------------------------------------------------------------------------


async def test_a_fetching_head_told_behind_relays_from_the_tail_and_ends_whole() -> None:
    """Behind over real TCP: a node fetching from the origin (the chain's head) hears it
    from a peer, moves to the tail (its replica parks no one), and still ends with the
    exact bytes."""
    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(8 << 18, generator=g)}  # 32 MiB in 64 chunks of 512 KiB
    origin = await Node.start("origin", secret=SECRET)
    head = await Node.start("head", secret=SECRET, dataplane=RELAY)
    peer = await Node.start("peer", secret=SECRET)
    routed(origin, head, peer)
    # The origin's uploads at 32 MB/s: the fetch takes about a second.
    origin.shaper = WanShaper("dc0", {"dc1": Link(32e6)}, lambda _name: "dc1")
    try:
        origin.serve("m", 1, sd, chunk_size=512 << 10)
        manifest = await (await head.peer(origin.address)).get_manifest("m", 1)
        into = empty_like_manifest(manifest)
        replica = Replica("m", 1, manifest, TensorBytes.for_destination(manifest, into))
        fetch = asyncio.create_task(
            swarm_fill(head, replica, [Holder(origin.address, 1, None, origin=True)])
        )
        deadline = time.monotonic() + 30
        while sum(replica.have) < 4:
            assert time.monotonic() < deadline and not fetch.done()
            await asyncio.sleep(0.005)
        await peer.peer(head.address)
        assert peer.tell_behind(head.address, ShardKey("m"), 1)
        while not replica.lagging:
            assert time.monotonic() < deadline, "the head never heard Behind"
            await asyncio.sleep(0.005)
        assert sum(replica.have) < manifest.num_chunks  # (it heard mid-fetch)
        await asyncio.wait_for(fetch, 30)
        assert same_bytes(sd["w"], into["w"])
    finally:
        for n in (origin, head, peer):
            await n.close()


async def test_behind_about_a_version_not_being_fetched_is_ignored() -> None:
    a = await Node.start("a", secret=SECRET)
    b = await Node.start("b", secret=SECRET)
    routed(a, b)
    heard: list[str] = []
    try:
        stop = b.watch_behind(ShardKey("m"), 2, heard.append)
        await a.peer(b.address)
        assert a.tell_behind(b.address, ShardKey("m"), 1)  # another version: no one listens
        assert a.tell_behind(b.address, ShardKey("m"), 2)
        deadline = time.monotonic() + 30
        while not heard:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        assert heard == ["a"]
        stop()
        assert not a.tell_behind("127.0.0.1:1", ShardKey("m"), 2)  # never dials
    finally:
        await a.close()
        await b.close()


async def test_an_origin_told_a_head_is_behind_sends_no_asker_to_it() -> None:
    """Behind.who: the link that found the head slow tells the origin too, which from then
    on serves a chunk it sent the head rather than sending the asker there (the head would
    answer "busy" for what it lacks; the holder view says it lags only a gossip round
    later)."""

    g = torch.Generator().manual_seed(6)
    sd = {"w": torch.randn(1 << 18, generator=g)}  # 1 MiB in 4 chunks
    origin = await Node.start("origin", secret=SECRET)
    head = await Node.start("head", secret=SECRET)
    second = await Node.start("second", secret=SECRET)
    routed(origin, head, second)
    try:
        asker, mine = await _sent_to_the_head(origin, head, second, sd)
        assert second.tell_behind(origin.address, ShardKey("m"), 1, who="head")
        deadline = time.monotonic() + 30
        while "head" not in origin.store.get("m", 1).laggards:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.005)
        await asker.get_chunk(mine, 0)  # served now, not sent to the head
        assert mine.have[0]
    finally:
        for n in (origin, head, second):
            await n.close()


async def test_an_origin_whose_holder_view_says_a_head_lags_sends_no_asker_to_it() -> None:
    """The other way an origin learns it (ClusterView.lagging: the head advertises itself
    lagging, a gossip round later): it serves rather than send an asker to the head."""
    from tensorhub.dataplane.view import Unaware

    class Said(Unaware):
        def __init__(self) -> None:
            self.lags: set[str] = set()

        def lagging(self, key: ShardKey, version: int, name: str) -> bool:
            return (key, version) == ("m", 1) and name in self.lags

    g = torch.Generator().manual_seed(7)
    sd = {"w": torch.randn(1 << 18, generator=g)}
    origin = await Node.start("origin", secret=SECRET)
    head = await Node.start("head", secret=SECRET)
    second = await Node.start("second", secret=SECRET)
    routed(origin, head, second)
    view = origin.view = Said()
    try:
        asker, mine = await _sent_to_the_head(origin, head, second, sd)
        view.lags = {"head"}
        await asker.get_chunk(mine, 0)
        assert mine.have[0]
    finally:
        for n in (origin, head, second):
            await n.close()


async def _sent_to_the_head(
    origin: Node, head: Node, second: Node, sd: dict[str, torch.Tensor]
) -> tuple[PeerHandler, Replica]:
    """``origin`` super-seeds ``sd`` (4 chunks); ``head`` gets chunk 0, so the origin names
    it; ``second`` asks for chunk 0 and is sent to the head. ``second``'s connection to
    the origin and the replica it fills."""
    from tensorhub.core.errors import Refused

    origin.serve("m", 1, sd, chunk_size=256 << 10, super_seed=10.0, seed_spare=False)
    up = await head.peer(origin.address)
    manifest = await up.get_manifest("m", 1)
    await up.get_chunk(_replica_of(manifest), 0)
    asker = await second.peer(origin.address)
    mine = _replica_of(manifest)
    try:
        await asker.get_chunk(mine, 0)
        raise AssertionError("the origin served a second copy at once")
    except Refused as redirect:
        assert redirect.holders == ["head"]
    return asker, mine


def _replica_of(manifest: Manifest) -> Replica:
    """An empty replica of version 1 of "m", into fresh tensors."""
    return Replica(
        "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(manifest))
    )
