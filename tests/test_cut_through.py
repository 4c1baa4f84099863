"""Serving a chunk while it lands (``DataPlaneConfig.cut_through``) over real loopback
connections: the asker gets the exact bytes, and bytes of a landing that fails (corrupt at
its source) never complete a chunk downstream, nor count against the node that passed
them on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tensorhub.core.errors import ChecksumMismatch, RemoteError
from tensorhub.core.manifest import Manifest
from tensorhub.core.swarm.presets import NODE, preset
from tensorhub.core.swarm.serve import START_PARK_CHUNKS
from tensorhub.dataplane import peer as peer_module
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.peer import PIECE, PeerHandler, byte_range
from tensorhub.dataplane.store import Replica
from tensorhub.io.tensors import TensorBytes, empty_like_manifest, tensor_digests
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.weights import llm_like_state_dict

from .transports import routed

SECRET = b"cut-through-secret"
CHUNK = 16 << 20  # many reads per chunk on loopback, so pieces go out while it lands
SIZE = 256 << 20


@contextlib.asynccontextmanager
async def trio() -> AsyncIterator[tuple[Node, Node, Node]]:
    """A holder, a node that cuts through, and an asker."""
    holder = await Node.start("holder", secret=SECRET)
    relay = await Node.start("relay", secret=SECRET, dataplane=preset("node:cut_through=true"))
    asker = await Node.start("asker", secret=SECRET, dataplane=NODE)
    routed(holder, relay, asker)
    try:
        yield holder, relay, asker
    finally:
        for n in (holder, relay, asker):
            await n.close()


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(2 * CHUNK // 4, generator=g), "b": torch.randn(10, generator=g)}


def _empty(manifest: Manifest) -> Replica:
    """A replica of version 1 of "m" with nothing held, into fresh tensors."""
    return Replica(
        "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(manifest))
    )


async def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # (however loaded the machine: it gets there)
    while not cond():
        assert time.monotonic() < deadline, f"waited 30 s for {what}"
        await asyncio.sleep(0.002)


async def _landing_replica(relay: Node, holder: Node) -> Replica:
    """The relay's replica of the holder's version, in its store, with nothing held yet."""
    peer = await relay.peer(holder.address)
    replica = _empty(await peer.get_manifest("m", 1))
    relay.store.add(replica)
    return replica


async def _asked_before_it_lands(
    asker: Node, relay: Node, landing: Replica, chunk: int
) -> tuple[Replica, asyncio.Task[None]]:
    """The asker's request for ``chunk``, parked at the relay (whose ``landing`` replica
    asked for the chunk, and has none of its bytes yet) before we return."""
    peer = await asker.peer(relay.address)
    mine = _empty(await peer.get_manifest("m", 1))
    task = asyncio.create_task(peer.get_chunk(mine, chunk))
    await _until(lambda: bool(landing.parked(chunk)), "the request to reach the relay")
    assert not task.done()
    return mine, task


class _CountingPool:
    """The verifiers' thread pool, counting the chunks handed to it."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool, self.jobs = pool, 0

    def submit(self, fn: Callable[..., object], /, *args: object) -> Future[object]:
        self.jobs += 1
        return self.pool.submit(fn, *args)


@pytest.fixture(params=["as_pieces_land", "once_in"])
def hashing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> _CountingPool:
    """Chunks hashed piece by piece as they land (every link slow enough), or each on a
    worker thread once it is in (no link slow enough): the verdict is the same."""
    if request.param == "as_pieces_land":
        monkeypatch.setattr(peer_module, "HASH_INLINE_RATE", 1e30)
        monkeypatch.setattr(peer_module, "HASH_INLINE_PIECE", CHUNK)
    else:
        monkeypatch.setattr(peer_module, "HASH_INLINE_RATE", 0.0)
    pool = _CountingPool(peer_module._verifiers)
    monkeypatch.setattr(peer_module, "_verifiers", pool)
    return pool


def _expect_jobs(hashing: _CountingPool, request: pytest.FixtureRequest) -> None:
    """Hashed as pieces landed: no chunk went to the worker thread; once in: every one."""
    if request.node.callspec.params["hashing"] == "as_pieces_land":
        assert hashing.jobs == 0
    else:
        assert hashing.jobs > 0


def test_byte_range_cuts_across_parts() -> None:
    parts = [memoryview(b"abc"), memoryview(b""), memoryview(b"defg"), memoryview(b"h")]
    assert b"".join(byte_range(parts, 2, 7)) == b"cdefg"
    assert b"".join(byte_range(parts, 0, 8)) == b"abcdefgh"
    assert byte_range(parts, 3, 3) == []


async def test_a_chunk_asked_for_while_it_lands_is_passed_on_whole_and_verified(
    hashing: _CountingPool, request: pytest.FixtureRequest
) -> None:
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        replica = await _landing_replica(relay, holder)
        replica.incoming[0] = "holder"  # as the relay's fetch does when it asks for the chunk
        mine, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 0)
        await asyncio.wait_for(asked, 10)
        assert replica.have[0] and mine.have[0]
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(0))
        assert b"".join(bytes(p) for p in mine.data.read_parts(0)) == want
        cut = sum(h.chunks_cut_through for h in relay.handlers)
        print(f"chunks passed on while they landed: {cut} (pieces of {PIECE} bytes)")
        _expect_jobs(hashing, request)


async def test_bytes_of_a_landing_that_fails_never_complete_a_chunk_downstream(
    hashing: _CountingPool, request: pytest.FixtureRequest
) -> None:
    """The holder's copy of chunk 0 is corrupt: the relay, passing it on as it lands,
    finds out only once it is all there. It answers the asker's request with "lost_chunk"
    instead of the last piece, so the asker drops the pieces (no corrupt chunk, and no
    strike against the relay, which was honest); asked again once the relay has a good
    copy, the asker gets the exact bytes."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        good = sd["w"][:16].clone()
        sd["w"][:16] = -good  # the holder's memory now differs from what it committed to
        replica = await _landing_replica(relay, holder)
        replica.incoming[0] = "holder"
        mine, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        up = await relay.peer(holder.address)
        with pytest.raises(ChecksumMismatch):
            await up.get_chunk(replica, 0)
        with pytest.raises(RemoteError) as lost:
            await asyncio.wait_for(asked, 10)
        assert lost.value.code == "lost_chunk"
        assert not mine.have[0] and not replica.have[0]

        sd["w"][:16] = good  # the holder is sound again: fetched anew, passed on whole
        await up.get_chunk(replica, 0)
        peer = await asker.peer(relay.address)
        await peer.get_chunk(mine, 0)
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(0))
        assert b"".join(bytes(p) for p in mine.data.read_parts(0)) == want
        _expect_jobs(hashing, request)


async def test_a_relay_link_that_falls_behind_answers_busy_for_what_it_lacks() -> None:
    """A link that judged itself lagging relays from the chain's tail: a request parked at
    it for a chunk it asked of its old upstream is answered "busy" at once (its asker then
    relays from the link before it), and so is any new request for a chunk it lacks; what
    it holds it still serves, exact."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        replica = await _landing_replica(relay, holder)
        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 1)  # it holds chunk 1
        replica.incoming[0] = "holder"
        mine, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        replica.lag()  # (what the fetch's driver does once its planner says so)
        with pytest.raises(RemoteError) as busy:
            await asyncio.wait_for(asked, 10)
        assert busy.value.code == "busy" and "behind" in str(busy.value)
        peer = await asker.peer(relay.address)
        with pytest.raises(RemoteError) as again:
            await asyncio.wait_for(peer.get_chunk(mine, 0), 10)
        assert again.value.code == "busy" and not replica.parked(0)
        await asyncio.wait_for(peer.get_chunk(mine, 1), 10)
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(1))
        assert b"".join(bytes(p) for p in mine.data.read_parts(1)) == want


async def test_a_link_that_holds_nothing_yet_parks_a_request_for_a_first_chunk() -> None:
    """A link whose fetch began and holds nothing yet, asked for one of the version's first
    chunks before it asked for that chunk itself (``presets.park_starting``), parks the
    request and passes the chunk on as it lands, exact; a later chunk (a probe for its
    news) is answered "no chunk" at once, and so is any chunk it has not asked for once
    it holds one (the chain has formed: what it asks for, it parks for)."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK // 8)
        replica = await _landing_replica(relay, holder)  # began: nothing held, nothing asked
        mine, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        peer = await asker.peer(relay.address)
        with pytest.raises(RemoteError) as later:
            await asyncio.wait_for(peer.get_chunk(mine, START_PARK_CHUNKS), 10)
        assert later.value.code == "no_chunk" and not replica.parked(START_PARK_CHUNKS)
        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 0)
        await asyncio.wait_for(asked, 10)
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(0))
        assert b"".join(bytes(p) for p in mine.data.read_parts(0)) == want
        with pytest.raises(RemoteError) as held_one:
            await asyncio.wait_for(peer.get_chunk(mine, 1), 10)
        assert held_one.value.code == "no_chunk" and not replica.parked(1)


async def test_a_request_parked_while_starting_is_answered_once_a_first_chunk_is_held() -> None:
    """A request parked only because the link held nothing yet (``starting``) waits on the
    link asking for that chunk first. A link whose own request for it was lost left the
    chunk to a rack-mate, and that rack-mate had asked *it*: each waited on the other
    (simulated, elastic with preemptions: 83 of seeds 0-999 never ended; the node would
    have waited out its request timeout). Once the link holds a chunk, what it parked
    only for starting is answered again: "no chunk" for one it has not asked for; one it
    has asked for stays parked and comes as it lands."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK // 8)
        replica = await _landing_replica(relay, holder)  # began: nothing held, nothing asked
        mine, waiting = await _asked_before_it_lands(asker, relay, replica, 0)
        replica.incoming[1] = "holder"  # (as the relay's fetch records it, asking for 1)
        other, asked = await _asked_before_it_lands(asker, relay, replica, 1)
        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 2)  # its first chunk, not one the asker waits for
        with pytest.raises(RemoteError) as none:
            await asyncio.wait_for(waiting, 10)
        assert none.value.code == "no_chunk" and not replica.parked(0)
        assert not asked.done() and replica.parked(1)
        await up.get_chunk(replica, 1)
        await asyncio.wait_for(asked, 10)
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(1))
        assert b"".join(bytes(p) for p in other.data.read_parts(1)) == want
        assert not mine.have[0]


async def test_a_new_asker_is_told_every_chunk_held_before_it_asked() -> None:
    """A link's news reaches only peers that asked it for the version, from their first
    request on; what it held before then reached them by gossip, a round late, and a relay
    asks no further than the run it knows its upstream holds (the hole left a link asking
    nothing for 0.3 s with its upstream 8 chunks ahead: docs/results.md, session 50). The
    first request on a connection is now told every chunk held, ahead of its reply, once;
    a complete replica (the holder view lists it as full) tells nothing."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK // 8)
        replica = await _landing_replica(relay, holder)
        up = await relay.peer(holder.address)
        for c in (0, 1, 3):
            await up.get_chunk(replica, c)
        told: list[tuple[str, list[int]]] = []
        unwatch = asker.watch_haves("m", 1, lambda addr, chunks: told.append((addr, chunks)))
        try:
            peer = await asker.peer(relay.address)
            mine = _empty(await peer.get_manifest("m", 1))  # (the Have comes ahead of it)
            assert told == [(relay.address, [0, 1, 3])]
            await asyncio.wait_for(peer.get_chunk(mine, 1), 10)
            assert told == [(relay.address, [0, 1, 3])]  # once per connection and version
            full = await asker.peer(holder.address)
            await full.get_manifest("m", 1)
            assert told == [(relay.address, [0, 1, 3])]
        finally:
            unwatch()


async def test_a_chunk_we_asked_the_asker_for_is_not_parked_for_it() -> None:
    """Two laggards each took the other for the laggard ahead of it (both held chunks past
    the same hole, so each seemed further on) and each asked the other for the hole's
    chunks: each parked the other's requests until its own came, and neither came
    (simulated, 250 Mbit/s, the last of four at half rate: the fetch never ended; the node
    would have waited out its request timeout). A request for a chunk we asked of the
    asker itself is answered "no chunk" at once; anyone else's waits for it."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        replica = await _landing_replica(relay, holder)
        replica.incoming[0] = "asker"  # (what the relay's fetch records as it asks "asker")
        peer = await asker.peer(relay.address)
        mine = _empty(await peer.get_manifest("m", 1))
        with pytest.raises(RemoteError) as none:
            await asyncio.wait_for(peer.get_chunk(mine, 0), 10)
        assert none.value.code == "no_chunk" and not replica.parked(0)
        replica.incoming[0] = "holder"  # asked of someone else: the asker waits for it
        _, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        asked.cancel()


def _chain(dataplane: str) -> list[Spec]:
    """A publisher and five fetchers r1..r5 in one rack, with ``dataplane``."""
    specs = [Spec("publisher", "dc0/rack0/publisher", voter=True, dataplane=dataplane)]
    return specs + [
        Spec(f"r{i}", f"dc0/rack0/r{i}", voter=i <= 2, dataplane=dataplane) for i in range(1, 6)
    ]


@pytest.mark.timeout(600)
def test_a_link_killed_mid_chain_leaves_the_rest_whole(tmp_path: Path) -> None:
    """Hub processes fetch as a chain cutting through (the ``relay`` preset); a link is
    killed (kill -9) while chunks stream through it. What it was passing on fails at its
    downstream as a lost connection, the chain closes over the gap, and every other
    fetcher ends with the publisher's exact bytes."""
    specs = _chain("relay:cut_through=true")
    names = [s.name for s in specs[1:]]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["publisher"], "publish", "policy", 1, SIZE, 1)
        c.call(names, "prepare", "policy", 1, None)
        c.call(names, "fetch", "policy", 1, None)
        deadline = time.monotonic() + 120
        while c.call(["r2"], "progress", "policy", 1)[0][0] < 2:
            assert time.monotonic() < deadline, "r2 made no progress"
            time.sleep(0.001)
        c.kill("r2")
        rest = [n for n in names if n != "r2"]
        done = c.call(rest, "result", "policy", 1, tag="done")
        print("failures by fetcher:", {n: d[2] for n, d in zip(rest, done, strict=True)})
        want = tensor_digests(llm_like_state_dict(SIZE, seed=1))
        for n, (digests,) in zip(rest, c.call(rest, "digests", "policy", 1), strict=True):
            assert digests == want, n


@pytest.mark.timeout(600)
def test_a_link_that_begins_late_joins_the_tail_and_everyone_ends_whole(tmp_path: Path) -> None:
    """Hub processes fetch as a chain cutting through; r3 begins its fetch only once r4
    holds a dozen chunks (the chain went on without it: r4 relays from r2). r3 joins the
    chain's tail, nobody relays from a link that far behind, and every fetcher, r3
    included, ends with the publisher's exact bytes."""
    specs = _chain("relay")
    names = [s.name for s in specs[1:]]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["publisher"], "publish", "policy", 1, SIZE, 1, 4 << 20)
        c.call(names, "prepare", "policy", 1, None)
        c.call([n for n in names if n != "r3"], "fetch", "policy", 1, None)
        deadline = time.monotonic() + 120
        while c.call(["r4"], "progress", "policy", 1)[0][0] < 12:
            assert time.monotonic() < deadline, "r4 made no progress"
            time.sleep(0.005)
        c.call(["r3"], "fetch", "policy", 1, None)
        done = c.call(names, "result", "policy", 1, tag="done")
        print("failures by fetcher:", {n: d[2] for n, d in zip(names, done, strict=True)})
        assert all(done for (done,) in c.call(names, "complete", "policy", 1))
        want = tensor_digests(llm_like_state_dict(SIZE, seed=1))
        for n, (digests,) in zip(names, c.call(names, "digests", "policy", 1), strict=True):
            assert digests == want, n


async def _ask(asker: Node, relay: Node, chunk: int) -> tuple[Replica, asyncio.Task[None], int]:
    """The asker's request for ``chunk`` of the relay, issued (its id known) before we
    return."""
    peer = await asker.peer(relay.address)
    mine = _empty(await peer.get_manifest("m", 1))
    rids: list[int] = []
    task = asyncio.create_task(peer.get_chunk(mine, chunk, issued=lambda _h, rid: rids.append(rid)))
    await _until(lambda: bool(rids), "the request to be issued")
    return mine, task, rids[0]


def _served_to(node: Node, name: str) -> int:
    return sum(h.bytes_served for h in node.handlers if h.conn.peer == name)


async def test_a_request_given_up_while_parked_is_ended_at_once_and_never_sent() -> None:
    """A request parked at a link until its chunk lands there, then given up by its asker
    (it follows another link now): the link answers "cancelled" at once, and once the
    chunk lands it sends the asker nothing. Before Cancel, it sent the whole chunk, which
    the asker read and dropped, taking its downlink from the link it followed instead."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        replica = await _landing_replica(relay, holder)
        replica.incoming[0] = "holder"
        mine, asked = await _asked_before_it_lands(asker, relay, replica, 0)
        peer = await asker.peer(relay.address)
        assert peer.requests_open == 1
        asked.cancel()  # get_chunk abandons its request as it is cancelled
        with pytest.raises(asyncio.CancelledError):
            await asked
        await _until(lambda: peer.requests_open == 0, 'the link\'s "cancelled"')

        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 0)  # the chunk lands at the link: nothing goes out
        await asyncio.sleep(0.2)
        assert _served_to(relay, "asker") == 0 and not mine.have[0]
        await asyncio.wait_for(peer.get_chunk(mine, 0), 10)  # the connection is in step
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(0))
        assert b"".join(bytes(p) for p in mine.data.read_parts(0)) == want


async def test_a_stream_given_up_mid_chunk_stops_at_the_next_piece() -> None:
    """A chunk the link passes on while it lands, given up by the asker halfway: the link
    sends no piece after the Cancel reaches it, ends the request with "cancelled", and
    the asker's connection stays in step (the next request gets exact bytes)."""
    sd = weights()
    async with trio() as (holder, relay, asker):
        holder.serve("m", 1, sd, chunk_size=CHUNK)
        replica = await _landing_replica(relay, holder)
        replica.incoming[0] = "holder"
        landing = replica.begin_landing(0)  # the link's own request: landing, by hand
        mine, asked, rid = await _ask(asker, relay, 0)
        peer = await asker.peer(relay.address)
        landing.advance(6 * PIECE)  # five pieces may go out (the last one waits)
        await _until(lambda: relay.handlers and _stream_sent(relay) >= 5 * PIECE, "pieces")
        peer.abandon(rid)
        await _until(lambda: peer.requests_open == 0, 'the link\'s "cancelled"')
        sent = _stream_sent(relay)
        landing.advance(CHUNK)  # the rest lands: none of it goes to the asker
        replica.end_landing(0, landing)
        await asyncio.sleep(0.2)
        assert _stream_sent(relay) == sent < CHUNK
        assert _served_to(relay, "asker") == 0 and not mine.have[0]
        with pytest.raises(asyncio.CancelledError):
            await asked
        up = await relay.peer(holder.address)
        await up.get_chunk(replica, 0)
        await asyncio.wait_for(peer.get_chunk(mine, 0), 10)
        want = b"".join(bytes(p) for p in holder.store.get("m", 1).data.read_parts(0))
        assert b"".join(bytes(p) for p in mine.data.read_parts(0)) == want


def _stream_sent(relay: Node) -> int:
    """Bytes the link has written to the asker's connection."""
    return sum(h.conn.bytes_sent for h in relay.handlers if h.conn.peer == "asker")


async def _backed_up(
    holder: Node, asker: Node, sd: dict[str, torch.Tensor], n: int
) -> tuple[PeerHandler, Manifest, Replica, list[asyncio.Task[None]]]:
    """``holder`` serves ``sd``; ``asker`` stops reading its connection and asks for the
    first ``n`` chunks: the first reply backs up and holds its upload slot, the rest wait
    behind it. The asker's connection, the manifest, its replica and the requests."""
    holder.serve("m", 1, sd, chunk_size=CHUNK, super_seed=10.0)  # (more than buffers hold)
    peer = await asker.peer(holder.address)
    manifest = await peer.get_manifest("m", 1)
    mine = _empty(manifest)
    peer.conn.pause_reading()  # the first reply backs up: its slot stays held
    rids: list[int] = []
    tasks = [
        asyncio.create_task(peer.get_chunk(mine, c, issued=lambda _h, rid: rids.append(rid)))
        for c in range(n)
    ]
    await _until(lambda: len(rids) == n, f"{n} requests")
    return peer, manifest, mine, tasks


async def test_replies_given_up_while_queued_behind_a_slot_are_never_sent() -> None:
    """A holder with one upload slot, its slot held by a reply the asker is slow to read:
    the asker's next two requests queue behind it. Given up, neither is sent: each ends
    with "cancelled" once the slot frees (the one the writer waits on) or at once (the one
    behind it), and the first still arrives whole."""
    sd = weights()
    holder = await Node.start("holder", secret=SECRET, dataplane=preset("node:upload_slots=1"))
    asker = await Node.start("asker", secret=SECRET, dataplane=NODE)
    routed(holder, asker)
    try:
        peer, manifest, mine, tasks = await _backed_up(holder, asker, sd, 3)
        await asyncio.sleep(0.2)  # they reach the holder, which queues two of them
        for t in tasks[1:]:
            t.cancel()
        await asyncio.sleep(0.2)  # the Cancels reach the holder
        peer.conn.resume_reading()
        await asyncio.wait_for(tasks[0], 10)
        await _until(lambda: peer.requests_open == 0, 'two "cancelled"')
        assert mine.have[0] and not mine.have[1] and not mine.have[2]
        assert _served_to(holder, "asker") == manifest.layout.chunk_len(0)
        # The origin sends later askers of chunk 0 to the asker, of 1 and 2 to no one.
        seeder = holder.store.get("m", 1).seeder
        assert seeder is not None
        assert seeder.recipients.get(0) == ["asker"]
        assert not seeder.recipients.get(1) and not seeder.recipients.get(2)
    finally:
        for n in (holder, asker):
            await n.close()


async def test_a_link_that_falls_behind_refuses_what_it_queued_for_links_that_do_not() -> None:
    """A link that judged itself lagging answers "busy" for the replies it had queued
    (chunks it holds, waiting for its one upload slot) to a link that does not lag, so
    that link moves on to the link before it at once rather than at our pace
    (bench/linerate.py --case slow, traced: 0.17-0.32 s after the verdict); the reply
    going out goes on, whole, and a lagging asker's queued reply is still sent."""
    sd = weights()
    holder = await Node.start("holder", secret=SECRET, dataplane=preset("node:upload_slots=1"))
    asker = await Node.start("asker", secret=SECRET, dataplane=NODE)
    laggard = await Node.start("laggard", secret=SECRET, dataplane=NODE)
    routed(holder, asker, laggard)
    try:
        peer, manifest, mine, tasks = await _backed_up(holder, asker, sd, 2)
        behind = await laggard.peer(holder.address)
        theirs = _empty(manifest)
        theirs.lagging = True  # (its requests say so: GetChunk.lagging)
        lagging_task = asyncio.create_task(behind.get_chunk(theirs, 2))
        queued = lambda: sum(len(h._out) for h in holder.handlers)  # noqa: E731
        await _until(lambda: queued() == 3, "three replies queued at the holder")
        served = holder.store.get("m", 1)
        served.lag()  # (what the fetch's driver does once its planner says so)
        holder.refuse_queued(served)
        peer.conn.resume_reading()
        await asyncio.wait_for(tasks[0], 10)
        with pytest.raises(RemoteError) as busy:
            await asyncio.wait_for(tasks[1], 10)
        assert busy.value.code == "busy" and "behind" in str(busy.value)
        await asyncio.wait_for(lagging_task, 10)
        assert mine.have[0] and not mine.have[1] and theirs.have[2]
        assert _served_to(holder, "asker") == manifest.layout.chunk_len(0)
        for c, replica in ((0, mine), (2, theirs)):
            want = b"".join(bytes(p) for p in served.data.read_parts(c))
            assert b"".join(bytes(p) for p in replica.data.read_parts(c)) == want
        # The origin counts the asker no recipient of the chunks it never sent it.
        assert served.seeder is not None
        assert not served.seeder.recipients.get(1)
        assert served.seeder.recipients.get(2) == ["laggard"]
        await asyncio.wait_for(peer.get_chunk(mine, 1), 10)  # the connection is in step
    finally:
        for n in (holder, asker, laggard):
            await n.close()
