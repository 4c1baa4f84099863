"""ChunkPlanner.next_due: the calls a fetch loop may skip are the ones a scan would find
nothing in.

The node's fetch loop wakes every 10 ms tick, and between chunks (three ticks apart at
1 Gbit/s) those wakeups asked for nothing, yet each planned afresh (session 43 counted
490-570 such calls a fetch, none of which asked for anything). The planner now notes
every comparison it makes with the clock, and answers from its memo until the first tick
at which one of them would answer otherwise. These tests plan at every tick, as the node
does, and check each call the memo answers against a scan of a copy of the planner
(``tensorhub.testing.planner_due``), through the simulator's runs of the bench's cases:
the chain and its lag verdicts, the head check, late joiners, crashes, a publisher that
stops, and owners' turns across a WAN."""

from __future__ import annotations

import random

import pytest

from sim.engine import Engine
from sim.fanout import predict_each
from sim.network import Network
from sim.swarm import Swarm, SwarmConfig
from sim.topology import GB, Cluster, TopologySpec
from tensorhub.core.swarm import ChunkPlanner, PlannerConfig
from tensorhub.core.swarm.presets import NODE
from tensorhub.testing.planner_due import DueMissed, check_quiet_until_due

MIB = 1 << 20

CASES = {
    "healthy": {},
    "slow": {"rates": {5: 500.0}},
    "late": {"late": {3: 0.5}},
    "killed": {"killed": {3: 0.4}},
    "stops": {"stops": True},
    "slow, second step": {"rates": {5: 500.0}, "steps": 2},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_call_the_memo_answers_in_the_benchs_cases_would_ask(case: str) -> None:
    """bench/linerate.py's cases at N=8, 256 MiB (64 chunks), the node's preset, planned
    every tick; each call answered from the memo is checked (DueMissed otherwise)."""
    for seed in (1, 2):
        print(f"[seed] {seed} case {case}")
        times = predict_each(
            8, 256 * MIB, 1000.0, 4 * MIB, NODE, seed, check_due=True, **CASES[case]
        )  # type: ignore[arg-type]
        assert sum(t < float("inf") for t in times) >= 7, times


def _swarm(seed: int, crash: str | None) -> Swarm:
    """Two datacenters of two racks of four, 32 chunks, owners' turns across the WAN and
    into racks, a crash 50 ms in; planned every tick with each memo answer checked."""
    e = Engine()
    c = Cluster.build(TopologySpec(dcs=2, racks_per_dc=2, hosts_per_rack=4))
    hosts = sorted(c.hosts)
    cfg = SwarmConfig(chunks=32, peers=6, check_due=True, planner=PlannerConfig(missing_ticks=10))
    s = Swarm(e, Network(e), c, 2 * GB, [hosts[0]], hosts[1:], cfg, seed=seed)
    s.start()
    if crash is not None:
        e.at(0.05, lambda: s.crash(crash))
    e.run(until=600)
    return s


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_call_the_memo_answers_across_a_wan_with_a_crash_would_ask(seed: int) -> None:
    print(f"[seed] {seed}")
    hosts = sorted(Cluster.build(TopologySpec(dcs=2, racks_per_dc=2, hosts_per_rack=4)).hosts)
    s = _swarm(seed, crash=hosts[5])
    assert s.done
    assert s.due_checks > 0


def test_the_memo_answers_most_calls_of_a_healthy_chain() -> None:
    """Not idle: in a healthy chain most of the calls a node makes each tick are answered
    from the memo (what the change is for)."""
    e = Engine()
    spec = TopologySpec(dcs=1, racks_per_dc=1, hosts_per_rack=9, nic_gbytes=0.125,
                        efficiency=1.0, oversubscription=1.0, hop_latency=5e-5)  # fmt: skip
    c = Cluster.build(spec)
    hosts = sorted(c.hosts)
    cfg = SwarmConfig.of(NODE, chunks=64, early_hints=False, tick=0.01, check_due=True,
                         member_grace=NODE.planner.member_grace)  # fmt: skip
    s = Swarm(e, Network(e), c, 256.0 * MIB, [hosts[0]], hosts[1:], cfg, seed=1)
    ticks = []
    s.on_done = lambda f: ticks.append(s.nodes[f].planner.now)  # type: ignore[union-attr]
    s.start()
    e.run()
    calls = sum(ticks)  # (one call a tick each, at least)
    print(f"{s.due_checks} of about {calls} calls answered from the memo")
    assert s.due_checks > calls // 2


def test_a_comparison_with_the_clock_left_unnoted_is_caught() -> None:
    """The check has teeth: a planner whose blocked source's back-off is read without
    noting it (as a missed ``_before`` would) says nothing is due while a scan at the
    back-off's end asks."""
    p = ChunkPlanner("me", 4, random.Random(0), PlannerConfig(total=4, per_source=4))
    p.set_source("a", 1, range(4))
    p.suspend("a", 5)
    assert p.next_requests() == []
    assert p.next_due() == 5  # the back-off's end, noted
    p._quiet = (p._changes, 1 << 62)  # as if it had not been
    for _ in range(5):
        p.tick()
    with pytest.raises(DueMissed):
        check_quiet_until_due(p)


def test_a_relay_links_news_from_the_link_after_it_is_no_change_once_it_holds_chunks() -> None:
    """In a chain every link tells the one before it of each chunk it gains, which that
    one holds already. A relay reads how far a link after it got only while it holds
    nothing, lags, or looks at its lag (``_reads_reach``); otherwise such news must leave
    the memo standing (counted in the node, N=8, 256 MiB: 34 of 214 calls a receiver
    answered from the memo with it taken as a change, 53 of 207 without). News from the
    upstream, and of a chunk we lack, stays a change."""
    cfg = PlannerConfig(relay=True, relay_min_chunks=1, total=4, per_source=4)
    p = ChunkPlanner("b", 8, random.Random(0), cfg)
    p.set_source("a", 1, [])  # before us in the chain: our upstream
    p.set_source("c", 1, [])  # after us
    before = p._changes
    p.add_chunk("c", 0)  # we hold nothing yet: did the chain go on without us?
    assert p._changes > before
    p.received(0, "a")
    before = p._changes
    p.add_chunk("c", 1)  # a chunk we lack: a change
    assert p._changes > before
    before = p._changes
    p.add_chunk("a", 0)  # it sent us 0 (received): known already, no news
    assert p._changes == before
    p.add_chunk("a", 2)  # our upstream's reach: a change
    assert p._changes > before
    before = p._changes
    p.add_chunk("c", 0)  # held already (by us), from a link after us: none
    p.add_chunk("c", 0)  # and a repeat: none either
    assert p._changes == before
