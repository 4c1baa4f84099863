"""Parity: the node's fetch driver and the simulator's make no decision of their own.

One scenario (holders, a fetcher, a holder lost mid-fetch, an endgame) runs through the
node's shell on loopback and through the simulator's shell. Each records every input its
FetchSession was given and what the session answered; replaying those inputs into a new
session over an identically built planner must give the same answers, input by input.
So, given the same events, the node and the simulator decide the same things in the same
order: the decisions live in the shared cores, and the shells only carry them out."""

from __future__ import annotations

import asyncio
import random

import torch

from sim.engine import Engine
from sim.network import Network
from sim.swarm import Swarm, SwarmConfig
from sim.topology import GB, Cluster, TopologySpec
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig
from tensorhub.core.swarm.presets import SWARM
from tensorhub.core.swarm.session import Abandon, Input, Outcome, Send, replay
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.swarm import Holder, swarm_fetch
from tensorhub.io.tensors import empty_like_manifest

from .models import same_bytes

SECRET = b"parity"


def actions(record: list[Input]) -> list[object]:
    return [a for i in record if isinstance(i.returned, list) for a in i.returned]


def failures(record: list[Input]) -> list[Outcome]:
    return [i.args[1] for i in record if i.method == "failed"]


async def test_the_node_shell_decides_nothing_the_core_does_not() -> None:
    """Three holders (two in our rack, one farther), one of them closed mid-fetch."""
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(8 << 20, generator=g), "b": torch.randn(1000, generator=g)}  # 33 chunks
    # (The swarm: the node's relay, run here beside it with the holder that had the most
    # requests in flight killed, failed 4 runs in about 140 under two busy loops in session
    # 23, two hanging in Node.close and two losing nothing after judging itself lagging at
    # 0 chunks; not diagnosed, docs/results.md.)
    nodes = [await Node.start(f"p{i}", secret=SECRET, dataplane=SWARM) for i in range(4)]
    a, b, c, me = nodes
    try:
        m = a.serve("m", 1, sd, chunk_size=1 << 20)
        b.serve("m", 1, sd, chunk_size=1 << 20)
        c.serve("m", 1, sd, chunk_size=1 << 20)
        holders = [Holder(a.address, 1), Holder(b.address, 1), Holder(c.address, 2)]
        record: list[Input] = []
        landed = 0
        closing: list[asyncio.Task[None]] = []

        def on_chunk(_replica: object, chunk: int) -> None:
            nonlocal landed
            landed += chunk >= 0
            if landed == 1:  # a rack-mate holder goes away with requests in flight
                for h in list(b.handlers):
                    h.conn.kill()
                # (its listener closes in the task's first step, before any redial of ours)
                closing.append(asyncio.ensure_future(b.close()))

        into = empty_like_manifest(m)
        await swarm_fetch(
            me,
            "m",
            1,
            into,
            holders,
            expected_root=m.root,
            seed=7,
            on_chunk=on_chunk,
            record=record,
        )
        await asyncio.gather(*closing)
        assert all(same_bytes(sd[k], into[k]) for k in sd)
    finally:
        for node in nodes:
            await node.close()
    assert Outcome.LOST in failures(record), failures(record)  # b's loss reached the core
    planner = ChunkPlanner(me.address, m.num_chunks, random.Random(7), SWARM.planner)
    assert replay(record, planner) == []
    assert planner.done


def test_the_simulator_shell_decides_nothing_the_core_does_not(seed: int) -> None:
    """The same shape simulated: an origin, fetchers in two racks, one crashing mid-fetch;
    every fetcher's session replays to the same decisions."""
    e = Engine()
    net = Network(e)
    c = Cluster.build(TopologySpec(dcs=1, racks_per_dc=2, hosts_per_rack=4))
    hosts = sorted(c.hosts)
    cfg = SwarmConfig(chunks=32, peers=8, record=True, planner=PlannerConfig(missing_ticks=10))
    s = Swarm(e, net, c, 8 * GB, [hosts[0]], hosts[1:], cfg, seed=seed)
    s.start()
    crashed = hosts[2]
    e.at(0.05, lambda: s.crash(crashed))
    e.run(until=600)
    assert s.done
    everything: list[object] = []
    for f in s.fetchers:
        node = s.nodes[f]
        assert node.session is not None and node.session.record is not None
        if f == crashed:
            continue
        record = node.session.record
        planner = ChunkPlanner(f, cfg.chunks, random.Random(node.planner_seed), s.planner_cfg)
        assert replay(record, planner) == [], f
        assert planner.done, f
        everything += actions(record)
    # The scenario has what the parity is about: endgame copies and losers abandoned.
    assert any(isinstance(a, Send) and a.request.duplicate for a in everything)
    assert any(isinstance(a, Abandon) for a in everything)
