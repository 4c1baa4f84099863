"""Gossip invariants G1–G8 (reference/correctness.md §6.2) in the seeded simulation."""

from __future__ import annotations

import math

import pytest

from tensorhub.core.gossip import GossipConfig, Status
from tensorhub.core.gossip.holders import Holding, encode_holding, hold_key
from tensorhub.testing.gossip_cluster import GossipCluster

CFG = GossipConfig()


def cluster(n: int, seed: int, **kw: object) -> GossipCluster:
    print(f"[seed] GossipCluster(n={n}, seed={seed}, {kw})")
    return GossipCluster(n, seed, **kw)  # type: ignore[arg-type]


def rounds_until(c: GossipCluster, cond: object, limit: int) -> float:
    start = c.ticks
    while not cond():  # type: ignore[operator]
        c.tick()
        if c.ticks - start > limit * c.cfg.round_ticks:
            raise AssertionError(f"condition not met within {limit} rounds")
    return (c.ticks - start) / c.cfg.round_ticks


def everyone_knows(c: GossipCluster, owner: str, key: str, value: bytes | None) -> bool:
    return all(nm == owner or c.knows(nm, owner, key) == value for nm in c.live())


def detection_bound(n: int) -> int:
    """Rounds within which every live node marks a crashed node dead (documented bound):
    the Lifeguard maximum suspicion timeout, plus a probe cycle and dissemination."""
    suspicion_max = CFG.suspicion_mult * max(1.0, math.log10(n)) * CFG.suspicion_max_mult
    return int(suspicion_max + 5 + 2 * math.ceil(math.log2(n)))


HOLD = encode_holding(Holding.of(b"\1" * 64))


@pytest.mark.parametrize(("n", "loss", "bound"), [(1000, 0.0, 15), (1000, 0.1, 20), (200, 0.3, 25)])
def test_g1_new_holder_entry_converges(n: int, loss: float, bound: int) -> None:
    c = cluster(n, 11, loss=loss)
    c.run_rounds(2)
    c.write("g7", hold_key("policy", 1), HOLD)
    r = rounds_until(c, lambda: everyone_knows(c, "g7", hold_key("policy", 1), HOLD), bound)
    print(f"converged in {r} rounds")
    # And the holder view answers: g7 holds chunk 5, for everyone.
    for nm in c.names:
        if nm != "g7":
            hs = c.nodes[nm].holders.holders("policy", 1)
            assert set(hs) == {"g7"} and hs["g7"].has(5)


def test_g2_versions_never_go_backwards_and_g3_owner_only(seed: int) -> None:
    c = cluster(60, seed, loss=0.2)
    seen: dict[tuple[str, str, str], tuple[int, int]] = {}
    rng = c.rng
    for _ in range(40):
        owner = rng.choice(c.names)
        c.write(owner, f"k{rng.randrange(4)}", bytes([rng.randrange(256)]))
        c.run_rounds(1)
        for obs in c.names:
            for owner_name, st in c.nodes[obs].state.nodes.items():
                for key, kv in st.kvs.items():
                    k = (obs, owner_name, key)
                    prev = seen.get(k, (st.generation, 0))
                    if prev[0] == st.generation:
                        assert kv.version >= prev[1], f"G2: {k} went from {prev} to {kv.version}"
                    seen[k] = (st.generation, kv.version)
    # G3 is checked by the harness on every change: nobody holds a value its owner never wrote.


@pytest.mark.parametrize("n", [50, 300])
def test_g4_crashed_nodes_are_marked_dead_everywhere_within_the_bound(n: int, seed: int) -> None:
    c = cluster(n, seed)
    c.run_rounds(2)
    victims = ["g3", "g4"]
    for v in victims:
        c.crash(v)
    r = rounds_until(
        c,
        lambda: all(c.status(o, v) in (Status.DEAD, None) for o in c.live() for v in victims),
        detection_bound(n),
    )
    print(f"all {n - 2} live nodes marked both dead after {r} rounds (bound {detection_bound(n)})")


def test_g5_no_false_death_with_10_percent_loss() -> None:
    c = cluster(300, 5, loss=0.1)
    c.run_rounds(60)
    dead = [(o, e) for o, core in c.nodes.items() for e in core.events if e[2] is Status.DEAD]
    assert dead == []


def test_g5_paused_node_refutes_and_is_not_declared_dead(seed: int) -> None:
    c = cluster(100, seed)
    c.run_rounds(2)
    c.paused.add("g9")
    c.run_rounds(4)  # well under the minimum suspicion timeout
    c.paused.discard("g9")
    c.run_rounds(20)
    assert all(c.status(o, "g9") is Status.ALIVE for o in c.live())
    assert not any(
        e[1] == "g9" and e[2] is Status.DEAD for core in c.nodes.values() for e in core.events
    )


def test_g6_stale_alive_cannot_resurrect_and_restart_does_not_revive_old_entries() -> None:
    c = cluster(40, 3)
    c.write("g5", hold_key("policy", 1), HOLD)
    c.run_rounds(10)
    stale_alive = c.nodes["g1"].members["g5"].update()
    c.crash("g5")
    rounds_until(c, lambda: all(c.status(o, "g5") in (Status.DEAD, None) for o in c.live()), 80)
    from tensorhub.core.gossip.messages import GGossip

    c.nodes["g1"].receive(GGossip("g2", (stale_alive,)))  # an old ALIVE replayed
    assert c.status("g1", "g5") in (Status.DEAD, None)
    assert all(not c.nodes[o].holders.holders("policy", 1) for o in c.live())
    c.restart("g5")  # fresh incarnation and generation; it holds nothing now
    rounds_until(c, lambda: all(c.status(o, "g5") is Status.ALIVE for o in c.live()), 40)
    c.run_rounds(10)
    assert all(c.knows(o, "g5", hold_key("policy", 1)) is None for o in c.live())
    assert all(not c.nodes[o].holders.holders("policy", 1) for o in c.live())


def test_g7_deleted_key_never_returns_after_gc() -> None:
    cfg = GossipConfig(tombstone_rounds=5)
    c = cluster(30, 8, config=cfg)
    c.write("g2", "h/m/1", b"held")
    c.run_rounds(8)
    # g9 misses the delete and everything after it, for longer than the tombstone grace.
    c.partition([n for n in c.names if n != "g9"], ["g9"])
    c.write("g2", "h/m/1", None)
    c.write("g2", "other", b"x")
    c.run_rounds(20)
    assert c.knows("g9", "g2", "h/m/1") == b"held"
    c.heal()
    c.run_rounds(30)
    assert all(c.knows(o, "g2", "h/m/1") is None for o in c.live())
    assert c.knows("g9", "g2", "other") == b"x"


def test_peers_tombstones_are_purged_too_not_kept_for_ever() -> None:
    """Regression (session 8, found by bench/small_versions.py): a node purged only its own
    tombstones, so each kept every peer's deleted keys for ever, and the state grew with
    every version a cluster dropped."""
    cfg = GossipConfig(tombstone_rounds=5)
    c = cluster(10, 4, config=cfg)
    for v in range(1, 21):  # g1 holds a version, then drops it, twenty times
        c.write("g1", hold_key("policy", v), HOLD)
        c.run_rounds(2)
        c.write("g1", hold_key("policy", v), None)
        c.run_rounds(1)
    c.run_rounds(10)  # past the grace
    for nm in c.names:
        kvs = c.nodes[nm].state.nodes["g1"].kvs
        assert not [k for k, kv in kvs.items() if kv.deleted], (nm, sorted(kvs))
    c.write("g1", hold_key("policy", 21), HOLD)  # and gossip still works afterwards
    rounds_until(c, lambda: everyone_knows(c, "g1", hold_key("policy", 21), HOLD), 15)
    assert all(c.knows(o, "g1", hold_key("policy", 3)) is None for o in c.live())


def test_g8_rediscovery_after_a_partition_longer_than_the_purge(seed: int) -> None:
    cfg = GossipConfig(reap_rounds=10)
    c = cluster(40, seed, config=cfg)
    c.run_rounds(2)
    left, right = c.names[:20], c.names[20:]
    c.partition(left, right)
    c.run_rounds(80 + 10 + 5)  # declared dead, then reaped, on both sides
    assert all(c.status("g0", o) is None for o in right)  # purged
    c.heal()
    r = rounds_until(
        c, lambda: all(c.status(a, b) is Status.ALIVE for a in c.names for b in c.names), 150
    )
    print(f"both sides rediscovered each other in {r} rounds after healing")


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_mass_restart(fraction: float, seed: int) -> None:
    c = cluster(60, seed)
    for nm in c.names:
        c.write(nm, hold_key("policy", 1), HOLD)
    c.run_rounds(15)
    restarted = c.names[: int(len(c.names) * fraction)]
    for nm in restarted:
        c.crash(nm)
    c.run_rounds(1)
    for nm in restarted:
        c.restart(nm)
    rounds_until(
        c, lambda: all(c.status(a, b) is Status.ALIVE for a in c.names for b in c.names), 200
    )
    c.run_rounds(15)
    # Restarted nodes hold nothing in their new life: nobody still lists their old entries.
    for o in c.names:
        holders = set(c.nodes[o].holders.holders("policy", 1))
        assert holders.isdisjoint(set(restarted) - {o}), o


def test_rejoin_after_purge() -> None:
    cfg = GossipConfig(reap_rounds=5)
    c = cluster(30, 21, config=cfg)
    c.run_rounds(2)
    c.crash("g4")
    c.run_rounds(60)
    assert all(c.status(o, "g4") is None for o in c.live())  # dead and purged everywhere
    c.restart("g4")
    rounds_until(c, lambda: all(c.status(o, "g4") is Status.ALIVE for o in c.live()), 60)
