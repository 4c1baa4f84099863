"""Staleness-bounded reads: ``latest_held`` / ``fetch(at_least=)`` take the newest version
at or above the bound that the nearest holders have whole, so a rollout across a WAN starts
on its own datacenter's v1 at once while v2 is still crossing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tensorhub import Hub
from tensorhub.core.errors import UnknownVersion
from tensorhub.core.naming import shard_key
from tensorhub.io.shaping import Link
from tensorhub.io.tensors import empty_like_manifest

from .test_hub import cluster, weights

RATE = 4e6  # bytes/s across the emulated WAN: 4 MiB take about a second


async def _until_held(hub: Hub, version: int, holder: Hub) -> None:
    """Wait until gossip tells ``hub`` that ``holder`` has the version whole."""
    for _ in range(800):
        held = hub.gossip.core.holders.holders(shard_key("policy", 0), version)
        if (h := held.get(holder.gossip.core.me.name)) is not None and h.complete:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"v{version}: gossip never showed {holder.address} holding it whole")


async def test_a_remote_rollout_starts_on_its_datacenters_older_version(tmp_path: Path) -> None:
    async with cluster(tmp_path, rollouts=4) as (voters, rolls):
        far1, far3 = rolls[1], rolls[3]  # dc1; rolls[0] and rolls[2] are in dc0
        for h in (*voters, *rolls):
            h.emulate_wan({"dc1" if h.locality.startswith("dc0") else "dc0": Link(RATE, 0.005)})
        pub1 = await voters[0].publish("policy", 1, weights(1, mib=4), chunk_size=1 << 20)
        await far1.fetch("policy", 1, empty_like_manifest(pub1.manifest))  # v1 crosses once
        await _until_held(far3, 1, far1)
        await voters[0].publish("policy", 2, weights(2, mib=4), chunk_size=1 << 20)
        crossing = asyncio.create_task(far1.fetch("policy", 2, empty_like_manifest(pub1.manifest)))
        t0 = time.monotonic()
        assert await far3.latest_held("policy", at_least=1) == 1  # near beats new
        res = await far3.fetch("policy", None, empty_like_manifest(pub1.manifest), at_least=1)
        took = time.monotonic() - t0
        assert res.version == 1
        assert not crossing.done(), "v2 crossed the WAN before the local read finished"
        print(f"local v1 read in {took:.2f}s while v2 crosses at {RATE / 1e6:.0f} MB/s")
        assert all(src == far1.address for src in res.sources)  # nothing crossed the WAN
        assert await far3.latest_held("policy", at_least=2) == 2  # only dc0 has it: farther
        with pytest.raises(UnknownVersion, match="latest v2"):
            await far3.latest_held("policy", at_least=3)
        with pytest.raises(TypeError):
            await far3.fetch("policy", 2, {}, at_least=1)
        assert (await crossing).version == 2
        await _until_held(far3, 2, far1)
        assert await far3.latest_held("policy", at_least=1) == 1  # its own copy is nearest
        near = rolls[0]  # dc0, the publisher's rack, holding nothing: v1 and v2 equally
        assert await near.latest_held("policy", at_least=1) == 2  # near, so the newest
