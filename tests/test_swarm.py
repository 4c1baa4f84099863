"""Swarm fetches over real loopback connections: many holders, failover, partial serving."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import torch

from tensorhub.core.errors import ChecksumMismatch, RemoteError, TransferError, UnknownVersion
from tensorhub.core.gossip.membership import Status
from tensorhub.core.messages import ChunkData
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig
from tensorhub.core.swarm.presets import SWARM
from tensorhub.core.swarm.session import DEAD_DOUBT_S, FetchSession, Input, Send
from tensorhub.core.wire import encode_header
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.peer import PeerHandler
from tensorhub.dataplane.store import Replica
from tensorhub.dataplane.swarm import (
    MOVED_ON_STALL,
    HeldOff,
    Holder,
    _suspend,
    superseded_and_stalled,
    swarm_fetch,
)
from tensorhub.dataplane.view import SourceNews, Unaware, Unwatch
from tensorhub.io import ucx
from tensorhub.io.shaping import Link, WanShaper
from tensorhub.io.tcp import Connection
from tensorhub.io.tensors import TensorBytes, empty_like_manifest
from tensorhub.io.ucx import UcxConnection

from .models import same_bytes
from .transports import routed


class PushedView(Unaware):
    """A cluster view whose news the test pushes (as gossip would), and which locates
    nodes by name."""

    def __init__(self, where: dict[str, tuple[str, int]] | None = None) -> None:
        self.where = where or {}
        self.tells: list[Callable[[SourceNews], None]] = []

    def watch_sources(
        self, model: str, version: int, tell: Callable[[SourceNews], None]
    ) -> Unwatch:
        self.tells.append(tell)
        return lambda: self.tells.remove(tell)

    def push(self, news: SourceNews) -> None:
        for tell in list(self.tells):
            tell(news)

    def locate(self, name: str) -> tuple[str, int] | None:
        return self.where.get(name)


SECRET = b"swarm-secret"


async def until(cond: Callable[[], bool], fetch: asyncio.Task[Any], what: str) -> None:
    """Poll ``cond`` while ``fetch`` runs: a fetch that ends (or fails) first, or 10 s
    passing, fails the test saying so, where an unbounded loop hung the suite. Polled
    every turn of the event loop (a holder serves a chunk per request, so at most one or
    two per turn): polled each millisecond, a loaded host's timers let the nearest holder
    serve all 32 chunks before it was killed "mid-transfer" (a fresh-clone make test, ucx)."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while not cond():
        if fetch.done():
            fetch.result()  # (its error, if it failed)
            raise AssertionError(f"the fetch ended before {what}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"10 s and not {what}")
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def nodes(n: int, transport: str = "tcp") -> AsyncIterator[list[Node]]:
    started = [await Node.start(f"s{i}", secret=SECRET, transport=transport) for i in range(n)]
    routed(*started)
    try:
        yield started
    finally:
        for node in started:
            await node.close()


def model(mib: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(mib << 17, generator=g).to(torch.bfloat16).view(-1, 256),
        "b": torch.randn(1000, generator=g),
        "step": torch.tensor(7),
    }


async def test_many_holders_each_with_part_bit_identical(transport: str) -> None:
    sd = model()
    async with nodes(4, transport) as (a, b, c, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        b.serve("m", 1, sd, chunk_size=1 << 20)
        c.serve("m", 1, sd, chunk_size=1 << 20)
        n = m.num_chunks
        holders = [
            Holder(a.address, 3, range(0, n // 3)),
            Holder(b.address, 1),
            Holder(c.address, 2, range(n // 2, n)),
        ]
        into = empty_like_manifest(m)
        served_before = sum(h.chunks_served for x in (a, b, c) for h in x.handlers)
        # No endgame: its duplicates go to the next-nearest holder by design (c, whenever
        # the last chunks are slow to land, as under load), and this test is about the rest.
        no_endgame = PlannerConfig(endgame_copies=0)
        await swarm_fetch(
            me, "m", 1, into, holders, expected_root=m.root, seed=1, config=no_endgame
        )
        assert all(same_bytes(sd[k], into[k]) for k in sd)
        # Locality: b (tier 1) holds everything, so the farther holders served nothing.
        assert sum(h.chunks_served for h in a.handlers) == 0
        assert sum(h.chunks_served for h in c.handlers) == 0
        assert sum(h.chunks_served for x in (a, b, c) for h in x.handlers) - served_before == n
        assert me.store.get("m", 1).complete  # and it serves the version now


async def test_holder_killed_mid_transfer_fetch_completes_from_others(transport: str) -> None:
    sd = model(32)
    async with nodes(3, transport) as (a, b, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        b.serve("m", 1, sd, chunk_size=1 << 20)
        cfg = PlannerConfig(endgame_copies=0, per_source=2, total=4)
        into = empty_like_manifest(m)
        task = asyncio.create_task(
            swarm_fetch(me, "m", 1, into, [Holder(a.address, 1), Holder(b.address, 2)], config=cfg)
        )
        await until(lambda: any(h.chunks_served for h in a.handlers), task, "a served a chunk")
        served_by_a = sum(h.chunks_served for h in a.handlers)
        await a.close()  # the nearest holder dies mid-transfer
        assert served_by_a < m.num_chunks, "a served every chunk before it was killed"
        await task
        assert all(same_bytes(sd[k], into[k]) for k in sd)
        assert sum(h.chunks_served for h in b.handlers) > 0


async def test_corrupt_holder_is_avoided_and_the_fetch_completes() -> None:
    sd = model(8)
    bad = {k: v.clone() for k, v in sd.items()}
    async with nodes(3) as (liar, honest, me):
        m = honest.serve("m", 1, sd, chunk_size=1 << 20)
        liar.serve("m", 1, bad, chunk_size=1 << 20)
        bad["w"].view(torch.int16).add_(1)  # its memory no longer matches its manifest
        into = empty_like_manifest(m)
        await swarm_fetch(
            me,
            "m",
            1,
            into,
            [Holder(liar.address, 0), Holder(honest.address, 3)],
            expected_root=m.root,
        )
        assert all(same_bytes(sd[k], into[k]) for k in sd)


class _SaysGone(PushedView):
    """A view that, as soon as a fetch watches it, says ``addr`` let go of the version."""

    def __init__(self, addr: str) -> None:
        super().__init__()
        self.addr = addr

    def watch_sources(
        self, model: str, version: int, tell: Callable[[SourceNews], None]
    ) -> Unwatch:
        unwatch = super().watch_sources(model, version, tell)
        asyncio.get_running_loop().call_soon(tell, SourceNews(gone=[self.addr]))
        return unwatch


@pytest.mark.parametrize("told", [False, True], ids=["stale hint", "the view says gone"])
async def test_a_holder_that_let_go_is_survived(told: bool) -> None:
    """A hint names a holder that no longer holds the version: the fetch completes from
    the other. Told so by the holder view (its advertisement was withdrawn: it
    unpublished), the fetch plans without it (``FetchSession.source_gone``); before, only
    new holders were applied, and a fetcher asked one that had unpublished again every
    ``gone_ticks`` until its fetch ended."""
    sd = model(4)
    async with nodes(3) as (a, gone, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        gone.serve("m", 1, sd, chunk_size=1 << 20)
        await gone.withdraw("m", 1)  # it said it held the version; it no longer does
        record: list[Input] = []
        into = empty_like_manifest(m)
        await swarm_fetch(
            me,
            "m",
            1,
            into,
            [Holder(gone.address, 0), Holder(a.address, 3)],
            expected_root=m.root,
            view=_SaysGone(gone.address) if told else None,
            record=record,
        )
        if told:
            assert ("source_gone", (gone.address,)) in [(i.method, i.args) for i in record]
        assert all(same_bytes(sd[k], into[k]) for k in sd)


async def test_no_usable_holder_is_a_clear_error_and_leaves_nothing_advertised() -> None:
    sd = model(4)
    async with nodes(2) as (a, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        half = range(m.num_chunks // 2)
        # (The swarm's planner: it asks a holder only for what it is said to hold. A relay
        # asks its upstream ahead of that, and ``a``, said to hold half, holds it all.)
        with pytest.raises(TransferError, match="no usable holder"):
            await swarm_fetch(
                me,
                "m",
                1,
                empty_like_manifest(m),
                [Holder(a.address, 1, half)],
                stall_timeout=0.3,
                config=SWARM.planner,
            )
        assert len(me.store) == 0


async def test_a_stalled_fetch_of_a_superseded_version_gives_up_soon() -> None:
    """A fetch whose version a newer one superseded, with no holder left for what it
    lacks (they fetched the newer version into the same memory), fails after
    MOVED_ON_STALL rather than the stall bound of the latest version: a launch's dc2
    rollouts stalled 10 s on such a v1 while v2 came and went (tests/test_launch.py).
    Until superseded, the same stall is waited on (a holder may yet be heard of)."""
    sd = model(4)
    async with nodes(2) as (a, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        half = range(m.num_chunks // 2)
        newer = [False]
        loop = asyncio.get_running_loop()
        fetch = asyncio.create_task(
            swarm_fetch(
                me,
                "m",
                1,
                empty_like_manifest(m),
                [Holder(a.address, 1, half)],  # (the swarm asks only for what it is told of)
                stall_timeout=120.0,
                config=SWARM.planner,
                superseded=lambda: newer[0],
            )
        )

        def got_half() -> bool:
            with contextlib.suppress(UnknownVersion):
                return me.store.get("m", 1).held == len(half)
            return False

        await until(got_half, fetch, "the half")
        await asyncio.sleep(MOVED_ON_STALL + 1.0)
        assert not fetch.done()  # stalled, not superseded: waits (for stall_timeout)
        newer[0] = True
        t0 = loop.time()
        with pytest.raises(TransferError, match=r"superseded .* no progress for"):
            await fetch
        took = loop.time() - t0
        print(f"superseded: failed {took:.2f}s after a newer version was known")
        assert took < 30.0  # the next idle tick; far under stall_timeout
        assert len(me.store) == 0


def test_a_superseded_fetch_whose_holders_answer_busy_is_not_given_up() -> None:
    """Holders that answer "busy" (or redirect) hold what we lack: a retained old version
    many fetch at once. The fetch gives up on a superseded version only once it made no
    progress and heard no such answer for MOVED_ON_STALL each."""
    session = FetchSession(ChunkPlanner("me", 4, random.Random(0), SWARM.planner))
    held_off = HeldOff()

    def gives_up(at: float, newer: bool = True) -> bool:  # idle since 0
        return superseded_and_stalled(session, held_off, at, at, lambda: newer)

    late = MOVED_ON_STALL + 0.5
    assert not gives_up(late, newer=False)  # not superseded: the stall bound applies
    assert gives_up(late)
    session.trouble["busy"] += 1  # a holder answered busy (seen at ``late``)
    assert not gives_up(late) and not gives_up(late + 1.0)
    assert gives_up(2 * late)  # quiet since
    session.trouble["redirected"] += 1
    assert not gives_up(3 * late)


async def test_partial_prefix_serving_while_fetching() -> None:
    """A fetcher serves each chunk as soon as it verified it, before it has the rest."""
    sd = model(16)
    async with nodes(4) as (a, b, relay, late):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        n = m.num_chunks
        got: list[int] = []
        first_half = asyncio.Event()

        def on_chunk(replica: Replica, chunk: int) -> None:
            if chunk < 0:  # the replica was announced before any chunk arrived
                assert not any(replica.have)
                return
            got.append(chunk)
            if len(got) == n // 2:
                first_half.set()

        # a can give the relay only the first half; b will hold the rest, but not yet.
        task = asyncio.create_task(
            swarm_fetch(
                relay,
                "m",
                1,
                empty_like_manifest(m),
                [Holder(a.address, 1, range(n // 2)), Holder(b.address, 2)],
                on_chunk=on_chunk,
                config=SWARM.planner,  # (a relay would ask ``a`` ahead, and it holds it all)
            )
        )
        await first_half.wait()
        partial = relay.store.get("m", 1)
        assert not partial.complete and sorted(got) == list(range(n // 2))
        peer = await late.peer(relay.address)
        manifest = await peer.get_manifest("m", 1, m.root)
        mine = Replica(
            "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(m))
        )
        await peer.get_chunk(mine, got[0])  # served from the relay's partial copy, verified
        with pytest.raises(TransferError, match="no_chunk"):
            await peer.get_chunk(mine, n - 1)  # never a chunk it has not verified
        b.serve("m", 1, sd, chunk_size=1 << 20)  # the rest appears; the relay finishes
        await task
        assert relay.store.get("m", 1).complete


async def test_fetching_a_version_held_here_copies_it_locally() -> None:
    sd = model(4)
    async with nodes(2) as (a, me):
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        await swarm_fetch(me, "m", 1, empty_like_manifest(m), [Holder(a.address, 1)])
        await a.close()  # no holder left on the network: the copy must be local
        again = empty_like_manifest(m)
        res = await swarm_fetch(me, "m", 1, again, [Holder(a.address, 1)], expected_root=m.root)
        assert res.bytes == m.total_bytes
        assert all(same_bytes(sd[k], again[k]) for k in sd)
        from tensorhub.core.errors import ManifestError

        with pytest.raises(ManifestError, match="expected"):
            await swarm_fetch(me, "m", 1, empty_like_manifest(m), [], expected_root=b"\0" * 16)


class _StallingHandler(PeerHandler):
    """Sends half of each chunk, stalls until released, then sends garbage for the rest:
    a slow holder that turns corrupt, to prove a lost race never touches the destination."""

    release = asyncio.Event()

    async def _write_loop(self) -> None:
        while not self.conn.is_closing:
            if not self._out:
                self._wake.clear()
                await self._wake.wait()
                continue
            reply = self._out.popleft()
            if not isinstance(reply.msg, ChunkData):
                payload = [reply.replica.manifest.encode()] if reply.replica else []
                await self.conn.send(reply.msg, payload)
                continue
            assert reply.replica is not None and reply.grant is not None
            data = b"".join(bytes(p) for p in reply.replica.data.read_parts(reply.chunk))
            if isinstance(self.conn, UcxConnection):  # messages: no half pieces; none at all
                zeros = bytes(len(data))
                await self.conn._ep.send(
                    encode_header(reply.msg, len(data), self.conn._sealer, [zeros])
                )
                await self.release.wait()
                try:
                    for piece in ucx.pieces([bytes(len(data))]):  # zeros: not the manifest's
                        await self.conn._ep.send(piece)
                except Exception:
                    return  # the fetcher dropped us: a posted receive cannot be withdrawn
                continue
            tr = self.conn._transport
            assert tr is not None
            half = data[: len(data) // 2]
            rest = bytes(len(data) - len(data) // 2)  # zeros: not what the manifest says
            tr.write(encode_header(reply.msg, len(data), self.conn._sealer, [half, rest]))
            tr.write(half)
            await self.release.wait()
            tr.write(rest)


class _StallingNode(Node):
    def _handler(self, conn: Connection) -> PeerHandler:
        h = _StallingHandler(conn, self.store, self.control, self.upload_grants)
        self.handlers.add(h)
        return h


async def test_endgame_copy_beats_a_stalled_holder_whose_late_bytes_never_land(
    transport: str,
) -> None:
    sd = model(2)  # two 1 MiB chunks and a bit: all in flight at once, so endgame starts
    _StallingHandler.release = asyncio.Event()
    stall = await _StallingNode.start("stall", secret=SECRET, transport=transport)
    routed(stall)
    try:
        async with nodes(2, transport) as (honest, me):
            m = stall.serve("m", 1, sd, chunk_size=1 << 20)
            honest.serve("m", 1, sd, chunk_size=1 << 20)
            into = empty_like_manifest(m)
            res = await asyncio.wait_for(
                swarm_fetch(
                    me,
                    "m",
                    1,
                    into,
                    [Holder(stall.address, 0), Holder(honest.address, 2)],
                    expected_root=m.root,
                ),
                5,
            )
            assert res.chunks == m.num_chunks
            assert all(same_bytes(sd[k], into[k]) for k in sd)
            # Now the stalled holder sends the rest of every chunk: zeros. They must be
            # read (the connection stays in sync) and land nowhere near the destination.
            _StallingHandler.release.set()
            peer = await me.peer(stall.address)
            await asyncio.sleep(0.2)
            assert (await peer.get_manifest("m", 1, m.root)).root == m.root
            assert all(same_bytes(sd[k], into[k]) for k in sd)
            assert me.store.get("m", 1).complete
    finally:
        await stall.close()


async def test_request_to_a_stalled_holder_times_out_and_others_finish(transport: str) -> None:
    sd = model(8)
    _StallingHandler.release = asyncio.Event()
    stall = await _StallingNode.start("stall", secret=SECRET, transport=transport)
    routed(stall)
    try:
        async with nodes(2, transport) as (honest, me):
            m = stall.serve("m", 1, sd, chunk_size=1 << 20)
            honest.serve("m", 1, sd, chunk_size=1 << 20)
            into = empty_like_manifest(m)
            await swarm_fetch(
                me,
                "m",
                1,
                into,
                [Holder(stall.address, 0), Holder(honest.address, 2)],
                expected_root=m.root,
                config=PlannerConfig(endgame_copies=0),
                request_timeout=0.3,
            )
            assert all(same_bytes(sd[k], into[k]) for k in sd)
    finally:
        _StallingHandler.release.set()
        await stall.close()


async def test_a_fetch_past_its_deadline_fails_naming_the_cause() -> None:
    """Issue #15 (3): a deadline used to surface as a bare TimeoutError with no message."""
    sd = model(4)
    _StallingHandler.release = asyncio.Event()
    stall = await _StallingNode.start("stall", secret=SECRET)
    try:
        async with nodes(1) as (me,):
            m = stall.serve("m", 1, sd, chunk_size=1 << 20)
            with pytest.raises(TransferError, match=r"not done after 0.5s.*missing.*timed out"):
                await swarm_fetch(
                    me,
                    "m",
                    1,
                    empty_like_manifest(m),
                    [Holder(stall.address, 0)],
                    expected_root=m.root,
                    request_timeout=0.2,
                    timeout=0.5,
                )
    finally:
        _StallingHandler.release.set()
        await stall.close()


async def test_a_source_gossip_declares_dead_is_dropped_at_once() -> None:
    """Issue #15 (3): a hung holder keeps its TCP connection open; gossip's verdict is what
    frees the requests stuck on it (before any request timeout). It hangs mid-payload
    right after starting one, so the verdict first waits out its doubt window
    (``DEAD_DOUBT_S``: no payload began after it) and is then carried out."""
    sd = model(8)
    _StallingHandler.release = asyncio.Event()
    stall = await _StallingNode.start("stall", secret=SECRET)
    try:
        async with nodes(2) as (honest, me):
            m = stall.serve("m", 1, sd, chunk_size=1 << 20)
            honest.serve("m", 1, sd, chunk_size=1 << 20)
            into = empty_like_manifest(m)
            t0 = asyncio.get_running_loop().time()
            view = PushedView()
            # alive for a while (requests to it are in flight and stuck), then dead
            verdict = asyncio.get_running_loop().call_later(
                0.3, view.push, SourceNews(health={stall.address: Status.DEAD})
            )
            res = await swarm_fetch(
                me,
                "m",
                1,
                into,
                [Holder(stall.address, 0), Holder(honest.address, 2)],
                expected_root=m.root,
                config=PlannerConfig(endgame_copies=0),
                request_timeout=30,
                view=view,
            )
            verdict.cancel()
            assert res.failures.get("holder dead") == 1, res.failures
            assert asyncio.get_running_loop().time() - t0 < 10  # not the request timeout
            assert all(same_bytes(sd[k], into[k]) for k in sd)
            assert "timed out" not in res.failures
    finally:
        _StallingHandler.release.set()
        await stall.close()


def test_a_suspect_still_sending_to_us_is_not_suspended() -> None:
    """Gossip suspects "a" (or declared it dead, a verdict the session doubts) while its
    payloads arrive: the fetch goes on asking it, so payloads keep beginning, and the doubt
    is settled by them; "b", suspect and silent, is asked for nothing new meanwhile.
    Suspending "a" too, the relay's head once stopped asking the publisher, the verdict
    was carried out, and the chain came apart (session 25: 3.0x one copy)."""
    s = FetchSession(ChunkPlanner("me", 16, random.Random(0), PlannerConfig(per_source=2)))
    for name in ("a", "b", "c"):
        s.planner.set_source(name, 1, None)
    asked = [a.request for a in s.requests(0.0) if isinstance(a, Send)]
    s.receiving(next(r for r in asked if r.source == "a"), 10.0)
    _suspend(s, {"a", "b"}, 10.0 + DEAD_DOUBT_S / 2)
    assert s.planner.sources["b"].blocked_until > s.planner.now
    assert s.planner.sources["a"].blocked_until <= s.planner.now
    _suspend(s, {"a", "b"}, 10.0 + DEAD_DOUBT_S)  # nothing began since: suspended now
    assert s.planner.sources["a"].blocked_until > s.planner.now


async def test_super_seeding_origin_sends_each_chunk_about_once() -> None:
    """Four fetchers at once: the origin hands each chunk to one of them and redirects the
    rest to whoever got it, so its egress stays near one model size (a star would be 4)."""
    sd = model(16)
    async with nodes(5) as (origin, *fetchers):
        m = origin.serve("m", 1, sd, chunk_size=1 << 20, super_seed=5.0, seed_spare=False)
        where = {n.name: (n.address, 1) for n in [origin, *fetchers]}
        views = [PushedView(where) for _ in fetchers]

        async def gossip() -> None:
            """What gossip would tell each fetcher: the others' verified chunks."""
            while True:
                await asyncio.sleep(0.01)
                for me, view in zip(fetchers, views, strict=True):
                    hs = [
                        Holder(f.address, 1, [i for i, h in enumerate(r.have) if h])
                        for f in fetchers
                        if f is not me
                        for r in f.store
                    ]
                    view.push(SourceNews(hs, [f.address for f in fetchers], []))

        gossiping = asyncio.ensure_future(gossip())
        intos = [empty_like_manifest(m) for _ in fetchers]
        try:
            await asyncio.gather(
                *(
                    swarm_fetch(
                        f,
                        "m",
                        1,
                        into,
                        [Holder(origin.address, 1, origin=True)],
                        expected_root=m.root,
                        view=view,
                        seed=i,
                    )
                    for i, (f, into, view) in enumerate(zip(fetchers, intos, views, strict=True))
                )
            )
        finally:
            gossiping.cancel()
        for into in intos:
            assert all(same_bytes(sd[k], into[k]) for k in sd)
        egress = sum(h.bytes_served for h in origin.handlers)
        print(f"origin egress {egress / m.total_bytes:.2f} model sizes (4 fetchers)")
        assert egress <= 1.2 * m.total_bytes
        replica = origin.store.get("m", 1)
        assert replica.seeder is not None and replica.seeder.refusals > 0


async def test_only_corrupt_holders_end_in_checksum_mismatch_after_retries() -> None:
    sd = model(4)
    bad = {k: v.clone() for k, v in sd.items()}
    async with nodes(2) as (liar, me):
        m = liar.serve("m", 1, bad, chunk_size=1 << 20)
        bad["w"].view(torch.int16).add_(1)
        with pytest.raises(ChecksumMismatch, match="do not match the published digests"):
            await swarm_fetch(
                me, "m", 1, empty_like_manifest(m), [Holder(liar.address, 1)], stall_timeout=0.5
            )
        assert len(me.store) == 0  # nothing half-fetched is held or advertised


async def test_a_request_for_a_chunk_on_its_way_waits_for_it_instead_of_failing() -> None:
    """Asked for a chunk it is receiving right now, a node answers once the chunk is
    verified (no "not yet" and retry: that round trip is what redirects lead to)."""
    sd = model(4)
    async with nodes(3) as (a, relay, late):
        m = a.serve("m", 1, sd, chunk_size=2 << 20)
        a.shaper = WanShaper("dcA", {"dcB": Link(4e6)}, lambda _name: "dcB")  # slow uploads
        task = asyncio.create_task(
            swarm_fetch(
                relay,
                "m",
                1,
                empty_like_manifest(m),
                [Holder(a.address, 1)],
                config=PlannerConfig(per_source=1, total=1, endgame_copies=0),
            )
        )
        await until(
            lambda: bool(relay.store) and bool(next(iter(relay.store)).incoming),
            task,
            "the relay was receiving a chunk",
        )
        partial = next(iter(relay.store))
        (c,) = partial.incoming
        assert not partial.have[c]
        peer = await late.peer(relay.address)
        manifest = await peer.get_manifest("m", 1, m.root)
        mine = Replica(
            "m", 1, manifest, TensorBytes.for_destination(manifest, empty_like_manifest(m))
        )
        await asyncio.wait_for(peer.get_chunk(mine, c), 10)  # parked, then served, verified
        assert mine.have[c] and partial.have[c]
        await task


async def test_a_have_reaches_the_versions_swarm_and_only_while_watched() -> None:
    """A fetcher's Have goes to the sources it names and to every peer that asked it for
    the version, ahead of gossip; a node that no longer watches the version ignores it."""
    async with nodes(3) as (a, b, c):
        got: list[tuple[str, str, list[int]]] = []
        stops = [
            n.watch_haves("m", 1, lambda addr, chunks, who=n.name: got.append((who, addr, chunks)))
            for n in (b, c)
        ]
        await a.peer(b.address)  # a fetches from b: b is named as a source
        with pytest.raises(RemoteError):  # (a does not hold it yet)
            await (await c.peer(a.address)).get_manifest("m", 1)  # c asked a: in the swarm
        a.announce("m", 1, 5, [b.address])
        for _ in range(200):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(got) == [("s1", a.address, [5]), ("s2", a.address, [5])]
        for stop in stops:
            stop()
        a.announce("m", 1, 6, [b.address])
        await asyncio.sleep(0.2)
        assert len(got) == 2
