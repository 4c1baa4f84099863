"""The control plane of a publish, run on the real Raft and gossip cores: how long until a
version is committed (the registry's Raft group, with its leader crashing if asked) and
until each node has heard of it (gossip of the publisher's holder entry over every node).

Each runs in its harness's own virtual clock (``tensorhub.testing``: the same cores the
real drivers run, their invariants checked online, a seed per run); the results, converted
to seconds with the real drivers' tick lengths, become when each fetch may begin in the
data-plane simulation. The two planes share no state, so running them one after the other
loses nothing but their overlap, which is small: a commit takes milliseconds, a fetch
seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorhub.control.gossip_driver import TICK_SECONDS as GOSSIP_TICK_S
from tensorhub.control.raft_driver import TICK_SECONDS as RAFT_TICK_S
from tensorhub.core.registry import PublishShard
from tensorhub.testing.gossip_cluster import GossipCluster
from tensorhub.testing.raft_cluster import TICK, Cluster

RAFT_UNIT_S = RAFT_TICK_S / TICK
"""Seconds per unit of the Raft harness's clock (a tick is TICK units)."""
LIMIT_S = 60.0


@dataclass(frozen=True)
class Commit:
    """When the publish was committed, seconds after it was proposed."""

    seconds: float
    leader_changes: int
    trace_hash: str


@dataclass(frozen=True)
class Spread:
    """When each node heard of the new version, seconds after the publisher announced it."""

    seconds: list[float]
    trace_hash: str


def commit_publish(seed: int, voters: int = 3, leader_crash: bool = False) -> Commit:
    """Propose a version on the registry's leader and wait for it to apply; with
    ``leader_crash`` the leader dies right after proposing, and the client, as the real
    registry client does, proposes again to whichever leader the voters elect."""
    c = Cluster(n=voters, seed=seed)
    limit = int(LIMIT_S / RAFT_UNIT_S)
    while c.leader() is None:
        c.step()
        if c.now > limit:
            raise RuntimeError(f"seed {seed}: no Raft leader within {LIMIT_S}s")
    start, first = c.now, c.leader()
    assert first is not None
    p = c.propose(first, PublishShard("m", 1, 0, 1, b"\x01" * 16, "trainer"))
    changes = 0
    if leader_crash:
        c.crash(first)
        c.lose_pending_of(first)
        p = None
    while p is None or p.ret is None:
        c.step()
        if c.now - start > limit:
            raise RuntimeError(f"seed {seed}: publish not committed within {LIMIT_S}s")
        lead = c.leader()
        if p is None and lead is not None and lead != first:
            changes += 1
            p = c.propose(lead, PublishShard("m", 1, 0, 1, b"\x01" * 16, "trainer"))
    c.check_log_matching()
    return Commit((p.ret - start) * RAFT_UNIT_S, changes, c.trace_hash())


def spread_version(seed: int, nodes: int, dcs: int = 1) -> Spread:
    """The publisher writes its holder entry; every node's gossip core must learn it."""
    g = GossipCluster(nodes, seed=seed, dcs=max(1, dcs))
    g.run_rounds(2)  # settled membership
    origin, key, value = g.names[0], "m/1", b"\x01"
    g.write(origin, key, value)
    start = g.ticks
    heard: dict[str, int] = {origin: start}
    limit = start + int(LIMIT_S / GOSSIP_TICK_S)
    while len(heard) < nodes:
        g.tick()
        for nm in g.names:
            if nm not in heard and g.knows(nm, origin, key) == value:
                heard[nm] = g.ticks
        if g.ticks > limit:
            raise RuntimeError(f"seed {seed}: {nodes - len(heard)} nodes never heard")
    return Spread([(heard[nm] - start) * GOSSIP_TICK_S for nm in g.names], g.trace_hash())
