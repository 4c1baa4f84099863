"""GossipCore.next_due: no tick before it does more than count, whatever the cluster goes
through (the driver sleeps until it instead of waking every tick)."""

from __future__ import annotations

import random

import pytest

from tensorhub.core.gossip import GossipConfig, GossipCore
from tensorhub.core.gossip.holders import Holding, encode_holding, hold_key
from tensorhub.testing.gossip_cluster import GossipCluster

HOLD = encode_holding(Holding.of(b"\1" * 16))


def test_an_idle_node_is_due_at_its_probe_steps_and_rounds_only() -> None:
    c = GossipCluster(8, seed=3, check_due=True)
    c.run_rounds(20)  # settled: nothing to suspect, nothing queued
    core = c.nodes["g0"]
    due_ticks = 0
    for _ in range(10 * c.cfg.round_ticks):
        if core.next_due() == core.now + 1:
            due_ticks += 1
        c.tick()
    # a round, a probe's start, its ack wait and its end: at most 4 of a round's 10 ticks
    assert due_ticks <= 4 * 10, due_ticks


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_no_tick_before_next_due_does_more_than_count(seed: int) -> None:
    """Loss, crashes, restarts, pauses (suspicions, refutations, raised awareness) and
    partitions, with holder writes throughout; GossipCluster(check_due=True) fails on the
    first tick that acted before its node said it was due."""
    print(f"[seed] {seed}")
    rng = random.Random(seed)
    c = GossipCluster(24, seed, loss=0.15, check_due=True)
    for step in range(40):
        c.run_rounds(2)
        roll = rng.random()
        name = c.names[rng.randrange(len(c.names))]
        if roll < 0.15 and name not in c.down:
            c.crash(name)
        elif roll < 0.3 and name in c.down:
            c.restart(name)
        elif roll < 0.45:
            c.paused.symmetric_difference_update({name})
        elif roll < 0.55:
            half = c.names[: len(c.names) // 2]
            c.partition(half, c.names[len(c.names) // 2 :])
        elif roll < 0.65:
            c.heal()
        elif name not in c.down:
            c.write(name, hold_key("policy", step), HOLD)
    assert c.ticks == 40 * 2 * c.cfg.round_ticks


def test_next_due_follows_a_received_ack_and_raised_awareness() -> None:
    cfg = GossipConfig()
    core = GossipCore("a", "addr-a", "dc0/r0/h0", random.Random(1), config=cfg)
    core.bootstrap({"a": ("addr-a", "dc0/r0/h0"), "b": ("addr-b", "dc0/r0/h1")})
    while core._probe is None:
        core.tick()
    start = core._probe.start
    assert core.next_due() == start + cfg.ack_ticks  # waiting for the ack
    core.awareness = 2  # (what a refutation or failed probes do): slower, longer waits
    assert core.next_due() == start + 3 * cfg.ack_ticks
    core._probe.acked = True
    assert core.next_due() == min(
        start + 3 * cfg.round_ticks - 1, (core.now // cfg.round_ticks + 1) * cfg.round_ticks
    )
