"""GossipNode's clock: ticks are counted only once it started, and not after it stopped."""

from __future__ import annotations

import asyncio

from tensorhub.control.gossip_driver import GossipNode
from tensorhub.dataplane.node import Node


async def test_a_write_before_start_counts_no_ticks_and_stop_leaves_no_timer() -> None:
    node = await Node.start("g", secret="s")
    gossip = GossipNode(node, "dc0/rack0/g", seed=1)
    try:
        await asyncio.sleep(0.05)
        gossip.advertise("m@0", 1, b"\1" * 4)  # before start: no clock runs yet
        assert gossip.core.now == 0 and gossip._timer is None
        loop = asyncio.get_running_loop()
        began = loop.time()
        await gossip.start()
        assert gossip._timer is not None  # the first due tick
        await asyncio.sleep(0.25)  # a round: the timer fired at least once
        gossip._catch_up()
        ticks = (loop.time() - began) / gossip.tick_seconds  # (a loaded host: more than 12)
        assert gossip.wakeups >= 1 and 1 <= gossip.core.now <= ticks + 1
        await gossip.stop()
        assert gossip._timer is None
        gossip.withdraw("m@0", 1)  # after stop: counted no further, no timer set again
        gossip._arm()
        assert gossip._timer is None
    finally:
        await gossip.stop()
        await node.close()
