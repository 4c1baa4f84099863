"""The Hub end to end, in one process: 3 voters, rollouts in two datacenters."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tensorhub.io.tensors as tensors_mod
from tensorhub import UnknownVersion
from tensorhub.core.errors import ChecksumMismatch
from tensorhub.dataplane.view import SourceNews
from tensorhub.hub import UCX_KEY, Hub, NoHolder, PublishRejected, SyncHub
from tensorhub.io import ucx
from tensorhub.io.tensors import empty_like_manifest
from tensorhub.io.ucx import UcxConnection

from .models import same_bytes
from .procs import free_ports

SECRET = "hub-secret"


def weights(version: int, mib: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed": torch.randn(mib << 16, 4, generator=g).to(torch.bfloat16),
        "norm": torch.randn(512, generator=g),
        "head": torch.randn(64, 64, generator=g).half(),
        "step": torch.tensor(version),
    }


@contextlib.asynccontextmanager
async def cluster(
    tmp: Path,
    rollouts: int = 3,
    transport: str = "tcp",
    dcs: int = 2,
    dataplane: str = "node",
    rack: str | None = None,
) -> AsyncIterator[tuple[list[Hub], list[Hub]]]:
    """3 voters in dc0/rack0, ``rollouts`` spread over ``dcs`` datacenters, in a rack
    each or all in ``rack``, every Hub running the data-plane preset ``dataplane``."""
    seeds = [f"127.0.0.1:{p}" for p in free_ports(3)]
    voters = [
        await Hub.start(
            f"voter{i}",
            locality=f"dc0/rack0/v{i}",
            listen=seeds[i],
            seeds=seeds,
            voter=True,
            data_dir=tmp / f"v{i}",
            secret=SECRET,
            transport="tcp",  # not "auto": that picks UCX on a host with a GPU or RDMA
            dataplane=dataplane,
        )
        for i in range(3)
    ]
    rolls = [
        await Hub.start(
            f"rollout{i}",
            locality=f"dc{i % dcs}/{rack or f'rack{i}'}/r{i}",
            seeds=seeds,
            secret=SECRET,
            transport=transport,
            dataplane=dataplane,
        )
        for i in range(rollouts)
    ]
    try:
        yield voters, rolls
    finally:
        for h in (*rolls, *voters):
            await h.close()


async def test_publish_fetch_latest_across_two_dcs(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (voters, rolls):
        trainer = voters[0]  # a voter can publish too
        for v in (1, 2):
            pub = await trainer.publish("policy", v, weights(v), chunk_size=1 << 20)
            assert pub.committed
        assert await rolls[0].latest("policy") == 2
        for r in rolls:
            into = empty_like_manifest(pub.manifest)
            res = await r.fetch("policy", 2, into)
            assert res.bytes == pub.manifest.total_bytes
            assert all(same_bytes(weights(2)[k], into[k]) for k in into)
        near = trainer.node.view.near  # who may queue longer here: our rack, from gossip
        assert near(rolls[0].node.name)  # dc0/rack0, as the voters
        assert not near(rolls[1].node.name) and not near("stranger")
        # Every fetcher holds the version now: the trainer may leave and fetches still work.
        await trainer.wait_replicated("policy", 2, copies=len(rolls))
        await trainer.unpublish("policy", 2)
        late = await Hub.start(
            "late", locality="dc1/rack9/l", seeds=[voters[1].address], secret=SECRET
        )
        try:
            into = empty_like_manifest(pub.manifest)
            await late.fetch("policy", 2, into)
            assert all(same_bytes(weights(2)[k], into[k]) for k in into)
        finally:
            await late.close()


@pytest.mark.skipif(not ucx.available(), reason="ucxx is not installed (tensorhub[ucx])")
async def test_ucx_inside_a_datacenter_tcp_across(tmp_path: Path) -> None:
    """Per peer pair: UCX where both ends have it and share a datacenter, TCP otherwise
    (across the WAN, and to the voters, which run TCP only here)."""
    async with cluster(tmp_path, rollouts=3, transport="ucx") as (voters, rolls):
        a, remote, b = rolls  # dc0, dc1, dc0
        for _ in range(500):  # until gossip has spread everyone's UCX address
            if all(r.gossip.core.state.get(o.node.name, UCX_KEY) for r in rolls for o in rolls):
                break
            await asyncio.sleep(0.01)
        assert isinstance((await b.node.peer(a.address)).conn, UcxConnection)
        assert not isinstance((await remote.node.peer(a.address)).conn, UcxConnection)
        assert not isinstance((await a.node.peer(voters[0].address)).conn, UcxConnection)
        pub = await voters[0].publish("policy", 1, weights(1), chunk_size=1 << 20)
        for r in (a, b, remote):  # b may take chunks from a over UCX, remote over TCP
            into = empty_like_manifest(pub.manifest)
            await r.fetch("policy", 1, into)
            assert all(same_bytes(weights(1)[k], into[k]) for k in into)


async def test_clear_errors(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        await voters[0].publish("policy", 1, weights(1))
        with pytest.raises(UnknownVersion, match="v7 is not committed"):
            await roll.fetch(
                "policy",
                7,
                empty_like_manifest((await voters[0].publish("other", 1, weights(2))).manifest),
            )
        with pytest.raises(PublishRejected, match="conflict"):
            await voters[1].publish("policy", 1, weights(99))  # another root for v1
        await voters[1].publish("policy", 3, weights(3))
        with pytest.raises(PublishRejected, match="stale"):
            await voters[1].publish("policy", 2, weights(2))  # not newer than v3
        assert len(voters[1].node.store) == 1  # the rejected versions are not served
        await roll.retain("policy", 1)
        await roll.release("policy", 1)
        with pytest.raises(UnknownVersion):
            await roll.retain("policy", 5)


async def test_sharded_version_commits_when_all_shards_are_in(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=2) as (voters, (r0, r1)):
        s0 = await voters[0].publish("policy", 1, weights(10), shard=0, num_shards=2)
        assert not s0.committed and await r0.latest("policy") == 0
        s1 = await voters[1].publish("policy", 1, weights(11), shard=1, num_shards=2)
        assert s1.committed and await r0.latest("policy") == 1
        into0, into1 = empty_like_manifest(s0.manifest), empty_like_manifest(s1.manifest)
        await r0.fetch("policy", 1, into0, shard=0)
        await r1.fetch("policy", 1, into1, shard=1)
        assert all(same_bytes(weights(10)[k], into0[k]) for k in into0)
        assert all(same_bytes(weights(11)[k], into1[k]) for k in into1)


async def test_watch_sees_new_versions(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        seen: list[int] = []

        async def watcher() -> None:
            async for v in roll.watch("policy", poll=0.05):
                seen.append(v)
                if v >= 2:
                    return

        task = asyncio.create_task(watcher())
        await voters[0].publish("policy", 1, weights(1, 1))
        await voters[0].publish("policy", 2, weights(2, 1))
        await asyncio.wait_for(task, 20)
        assert seen[-1] == 2 and seen == sorted(set(seen))


def test_sync_facade(tmp_path: Path) -> None:
    seeds = [f"127.0.0.1:{p}" for p in free_ports(1)]
    voter = SyncHub(
        name="v", listen=seeds[0], seeds=seeds, voter=True, data_dir=tmp_path, secret=SECRET
    )
    roll = SyncHub(name="r", seeds=seeds, secret=SECRET)
    try:
        pub = voter.publish("policy", 1, weights(3, 1))
        assert roll.latest("policy") == 1
        into = empty_like_manifest(pub.manifest)
        roll.fetch("policy", 1, into)
        assert all(same_bytes(weights(3, 1)[k], into[k]) for k in into)
    finally:
        roll.close()
        voter.close()


async def test_last_holder_unpublishing_the_latest_keeps_a_verified_cpu_copy(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        trainer = voters[0]
        w = weights(1)
        pub = await trainer.publish("policy", 1, w, chunk_size=1 << 20)
        assert await trainer.unpublish("policy", 1)  # nobody else holds the latest: kept
        for t in w.values():
            t.zero_()  # the trainer's buffers are free again: it overwrites them
        into = empty_like_manifest(pub.manifest)
        await roll.fetch("policy", 1, into)  # served from the CPU copy
        assert all(same_bytes(weights(1)[k], into[k]) for k in into)
        # A newer version supersedes it: the copy is let go once v2 commits.
        await trainer.publish("policy", 2, weights(2), chunk_size=1 << 20)
        assert [r.version for r in trainer.node.store] == [2]


async def test_without_a_copy_the_version_is_unavailable_never_wrong(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        w = weights(1)
        pub = await voters[0].publish("policy", 1, w, chunk_size=1 << 20)
        assert not await voters[0].unpublish("policy", 1, keep_copy=False)
        with pytest.raises(NoHolder):
            await roll.fetch("policy", 1, empty_like_manifest(pub.manifest), timeout=1.0)


async def test_a_version_read_as_latest_just_before_it_was_superseded_fails_within_patience(
    tmp_path: Path,
) -> None:
    """Regression (CI, tests/test_cluster_page.py): a rollout read v1 as the latest, and
    before it asked for v1's manifest, v2 committed and every holder of v1 moved on. It
    waited its whole timeout (300 s in the launch) for a holder of v1, while the run went
    on without it. Now: NoHolder, naming the newer version, within the patience (half the
    timeout here); the latest version is still waited for to the deadline."""
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        trainer = voters[0]
        await trainer.publish("policy", 1, weights(1), chunk_size=1 << 20)
        p2 = await trainer.publish("policy", 2, weights(2), chunk_size=1 << 20)
        assert not await trainer.unpublish("policy", 1, keep_copy=False)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(NoHolder, match=r"policy v1: its holders moved on \(v2 is committed\)"):
            await roll.manifest("policy", 1, timeout=8.0)  # patience: 4 s
        took = loop.time() - t0
        print(f"moved on: NoHolder after {took:.1f}s")
        assert took < 8.0
        assert not await trainer.unpublish("policy", 2, keep_copy=False)
        t0 = loop.time()
        with pytest.raises(NoHolder):
            await roll.fetch("policy", 2, empty_like_manifest(p2.manifest), timeout=3.0)
        assert loop.time() - t0 >= 3.0  # the latest: no holder yet may mean not yet told


async def test_a_buffer_changed_before_unpublish_is_caught_not_served(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        w = weights(1)
        pub = await voters[0].publish("policy", 1, w, chunk_size=1 << 20)
        w["embed"].add_(1)  # breaks the mutability contract
        with pytest.raises(ChecksumMismatch, match="changed while published"):
            await voters[0].unpublish("policy", 1)
        assert len(voters[0].node.store) == 0  # withdrawn: nothing wrong is served
        with pytest.raises(NoHolder):
            await roll.fetch("policy", 1, empty_like_manifest(pub.manifest), timeout=1.0)


async def test_a_retained_version_is_kept_when_its_last_holder_leaves(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        trainer = voters[0]
        await trainer.publish("policy", 1, weights(1), chunk_size=1 << 20)
        await roll.retain("policy", 1)
        await trainer.publish("policy", 2, weights(2), chunk_size=1 << 20)
        assert await trainer.unpublish("policy", 1)  # not latest, but retained: kept
        assert not await trainer.unpublish("policy", 2, keep_copy=False)
        await roll.release("policy", 1)


async def test_a_holder_back_from_suspicion_is_a_source_again(tmp_path: Path) -> None:
    """Fetches hear of holders as events. A holder gossip suspected or declared dead was
    dropped as a source; when its status changes back, the news lists it again, complete
    holders included (they advertise nothing new that would bring them back)."""
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        await voters[0].publish("policy", 1, weights(1))
        heard: list[SourceNews] = []
        unwatch = roll._watch_sources("policy@0", 1, heard.append)
        try:
            for _ in range(500):  # until gossip lists the publisher's holding here
                if roll._sources("policy@0", 1).holders:
                    break
                await asyncio.sleep(0.01)
            heard.clear()
            roll._on_gossip_changes({}, {voters[0].node.name})  # its status changed
            (news,) = heard
            assert [h.addr for h in news.holders] == [voters[0].address]
            assert news.holders[0].chunks is None  # complete
            assert news.health is not None and voters[0].address in news.health
        finally:
            unwatch()
        assert not roll._source_watch


async def test_a_holder_that_unpublishes_is_news_of_a_gone_source(tmp_path: Path) -> None:
    """When gossip withdraws a holder's advertisement, the fetches watching that version
    hear it as ``gone`` (and plan without it, tests/test_swarm.py), not only holders
    that appeared or grew."""
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1))
        await rolls[0].fetch("policy", 1, empty_like_manifest(pub.manifest))
        heard: list[SourceNews] = []
        unwatch = rolls[1]._watch_sources("policy@0", 1, heard.append)
        try:
            for _ in range(500):  # until gossip lists both holders here
                if len(rolls[1]._sources("policy@0", 1).holders) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(rolls[1]._sources("policy@0", 1).holders) == 2
            assert not await voters[0].unpublish("policy", 1, keep_copy=False)
            for _ in range(500):
                if any(voters[0].address in n.gone for n in heard):
                    break
                await asyncio.sleep(0.01)
            assert any(voters[0].address in n.gone for n in heard), heard
            assert [h.addr for h in rolls[1]._sources("policy@0", 1).holders] == [rolls[0].address]
        finally:
            unwatch()


async def test_a_holder_declared_dead_is_not_news_of_a_gone_source(tmp_path: Path) -> None:
    """Gossip drops a dead node's advertisements with the verdict. That is news for the
    failure detector's path (``health``: ``source_dead`` abandons what is in flight to
    it), not ``gone``: listed as gone too, the fetch unlisted it first, the verdict then
    found no such source, and requests to a hung holder waited out their timeout."""
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1))
        await rolls[0].fetch("policy", 1, empty_like_manifest(pub.manifest))
        core, name = rolls[1].gossip.core, rolls[0].node.name
        for _ in range(500):  # until gossip lists rolls[0]'s holding here
            if name in core.holders.holders("policy@0", 1):
                break
            await asyncio.sleep(0.01)
        assert name in core.holders.holders("policy@0", 1)  # (else nothing below is tested)
        member = core.members[name]
        core._dead(member, member.inc)  # the verdict, as the failure detector gives it
        assert name not in core.holders.holders("policy@0", 1)  # dropped with it
        news = rolls[1]._sources("policy@0", 1, changed={name})
        assert rolls[0].address not in news.gone


async def test_gossip_and_raft_do_not_share_the_chunk_connection(tmp_path: Path) -> None:
    """Control messages travel on a connection of their own (Node.control_peer): queued
    behind chunk payload on a saturated NIC, a gossip probe missed its ack and a live
    holder was declared dead (bench/linerate.py)."""
    async with cluster(tmp_path, rollouts=1) as (voters, (roll,)):
        pub = await voters[0].publish("policy", 1, weights(1))
        into = empty_like_manifest(pub.manifest)
        await roll.fetch("policy", 1, into)
        data = roll.node._peers[voters[0].address]
        control = await roll.node.control_peer(voters[0].address)
        assert control is not data and control.conn is not data.conn
        assert roll.node._control[voters[0].address] is control  # kept apart from _peers


async def test_a_version_committed_a_moment_ago_is_found_through_its_publisher(
    tmp_path: Path,
) -> None:
    """Before gossip tells a rollout who holds a new version (a round or two), the registry
    already names its publisher: the fetch asks it at once instead of waiting."""
    async with cluster(tmp_path, rollouts=1) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1, mib=1))
        assert pub.committed
        r = rolls[0]
        r.gossip.core.holders.forget(voters[0].gossip.core.name)  # gossip "has not told us"
        hint = await r._publisher_hint("policy@0", 1)
        assert [h.addr for h in hint] == [voters[0].address] and hint[0].origin
        assert await r._publisher_hint("policy@0", 2) == []  # not committed: no hint
        into = empty_like_manifest(pub.manifest)
        assert (await r.fetch("policy", 1, into)).bytes == pub.manifest.total_bytes


async def test_publish_and_keep_copy_do_their_heavy_work_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hashing a version, copying a version held here into a fetch's tensors, and
    allocating the copy unpublish keeps, run in threads: on the
    event loop they silenced the node's gossip for as long (seconds for a large model, on
    a busy host), and peers could take a live node for dead (bench/linerate.py's harness
    zeroing 1 GiB on its loop: docs/results.md, session 26)."""
    threads: dict[str, int] = {}

    def spy(name: str, fn: Any) -> Any:
        def wrapped(*a: Any, **kw: Any) -> Any:
            threads[name] = threading.get_ident()
            return fn(*a, **kw)

        return wrapped

    monkeypatch.setattr(
        "tensorhub.dataplane.node.build_manifest", spy("hash", tensors_mod.build_manifest)
    )
    monkeypatch.setattr(
        "tensorhub.dataplane.node.empty_like_manifest",
        spy("allocate", tensors_mod.empty_like_manifest),
    )
    monkeypatch.setattr("tensorhub.dataplane.swarm.copy_chunk", spy("copy", tensors_mod.copy_chunk))
    loop_thread = threading.get_ident()
    async with cluster(tmp_path, rollouts=1, dcs=1) as (voters, rolls):
        trainer = voters[0]
        pub = await trainer.publish("policy", 1, weights(1), chunk_size=1 << 20)
        assert "hash" in threads and threads["hash"] != loop_thread
        # The publisher, the version's only holder, reads it into other tensors: a local,
        # checked copy (gossip lists only other holders: this failed with NoHolder).
        own = empty_like_manifest(pub.manifest)
        res = await trainer.fetch("policy", 1, own)
        assert res.bytes == pub.manifest.total_bytes
        assert all(same_bytes(weights(1)[k], own[k]) for k in own)
        assert threads.pop("copy") != loop_thread
        # The last holder of the latest version keeps a copy: allocated off the loop too.
        assert await trainer.unpublish("policy", 1, keep_copy=True)
        assert "allocate" in threads and threads["allocate"] != loop_thread
        # A second fetch of a version a node holds copies it locally, checked: off the loop.
        first, second = empty_like_manifest(pub.manifest), empty_like_manifest(pub.manifest)
        await rolls[0].fetch("policy", 1, first)
        assert "copy" not in threads
        await rolls[0].fetch("policy", 1, second)
        assert "copy" in threads and threads["copy"] != loop_thread
        assert all(same_bytes(weights(1)[k], second[k]) for k in second)


async def test_a_lag_is_remembered_for_every_nodes_next_fetch_and_a_fetch_without_clears_it(
    tmp_path: Path,
) -> None:
    """The lag memory through Hubs and their gossip: the memory a fetch that fell behind
    leaves (``GossipNode.remember_lag``, from ``_fetch_whole``'s progress) reaches every
    node's next fetch of the key, its own too, through its view
    (``ClusterView.lagged_before``, by address; ChunkPlanner.set_lagged_before); the
    node's next whole fetch that did not lag clears it everywhere."""
    async with cluster(tmp_path, rollouts=2, dcs=1) as (voters, rolls):
        pub = await voters[0].publish("policy", 1, weights(1))
        slow = rolls[0]
        slow.gossip.remember_lag("policy@0", 1, True)  # (as a fetch that lagged leaves it)

        async def memory_everywhere(want: frozenset[str]) -> None:
            for _ in range(500):
                if all(h.node.view.lagged_before("policy@0") == want for h in (*rolls, *voters)):
                    return
                await asyncio.sleep(0.01)
            raise AssertionError([h.node.view.lagged_before("policy@0") for h in rolls])

        await memory_everywhere(frozenset({slow.address}))
        assert rolls[1].node.view.lagged_before("value@0") == frozenset()  # (per key)
        await slow.fetch("policy", 1, empty_like_manifest(pub.manifest))  # (it did not lag)
        await memory_everywhere(frozenset())


async def test_idle_gossip_wakes_for_due_ticks_only_and_keeps_the_clock(tmp_path: Path) -> None:
    """The gossip timer wakes a node only at ticks its core is due at (next_due), yet the
    core's clock still counts the ticks between: a second of idling moves ``now`` by up
    to 50 ticks (20 ms each) on fewer than half as many wakeups, and nobody is
    suspected."""
    async with cluster(tmp_path, rollouts=2) as (voters, rolls):
        g = rolls[0].gossip
        for _ in range(500):  # until every member is alive here
            if len(g.core.alive()) == 5:
                break
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        woke, began, t0 = g.wakeups, g.core.now, loop.time()
        await asyncio.sleep(1.0)
        g._catch_up()  # (the ticks since the last wakeup, as the next message would count)
        ticks = g.core.now - began
        elapsed = loop.time() - t0
        # (a late timer's lag is absorbed, not caught up: on a loaded machine the clock
        # runs slow, never fast)
        assert elapsed / g.tick_seconds / 2 <= ticks <= elapsed / g.tick_seconds + 1
        assert 0 < g.wakeups - woke < ticks / 2, (g.wakeups - woke, ticks)
        assert sorted(g.core.alive()) == sorted(h.node.name for h in (*voters, *rolls))
