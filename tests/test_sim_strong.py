"""The strongest honest baselines (sim/strong.py) against closed forms, paired with
TensorHub under the same accounting, and summarized over seeds (sim/headlines.py)."""

from __future__ import annotations

import json

import pytest

from sim.baselines import ring_broadcast
from sim.headlines import Spread, from_json, headlines
from sim.report import strongest_section
from sim.scenario import Scenario
from sim.strong import h2d_s, rack_chains, relay_then_ring, snapshot_s, static_p2p
from sim.swarm import SwarmConfig
from sim.topology import GB, Cluster, TopologySpec
from sim.workloads import run

TOPO = TopologySpec(racks_per_dc=4, hosts_per_rack=4)
NIC = TOPO.nic_gbytes * GB * TOPO.efficiency
SIZE = 8 * GB


def test_static_p2p_spreads_receivers_over_sources_before_locality() -> None:
    """4 receivers, 2 sources: 2 pulls per source uplink, each at half its rate."""
    c = Cluster.build(TOPO)
    hosts = sorted(c.hosts)
    sources, receivers = hosts[:2], hosts[4:8]  # rack 0 serves rack 1
    done = static_p2p(c, sources, dict.fromkeys(receivers, 0.0), SIZE, {})
    assert max(done.values()) == pytest.approx(2 * SIZE / NIC, rel=0.01)


def test_a_preempted_source_hands_its_receivers_remaining_bytes_on() -> None:
    c = Cluster.build(TOPO)
    hosts = sorted(c.hosts)
    sources, receivers = hosts[:3], hosts[4:6]
    calm = static_p2p(c, sources, dict.fromkeys(receivers, 0.0), SIZE, {})
    copy = SIZE / NIC
    assert max(calm.values()) == pytest.approx(copy, rel=0.01)  # one source each
    crashed = static_p2p(
        Cluster.build(TOPO), sources, dict.fromkeys(receivers, 0.0), SIZE, {hosts[0]: copy / 2}
    )
    # The receiver of the dead source resumes from the idle third source: nothing is lost,
    # so it still finishes in one copy's time (plus a hop's latency).
    assert max(crashed.values()) == pytest.approx(copy, rel=0.01)
    with pytest.raises(RuntimeError, match="every source crashed"):
        static_p2p(
            Cluster.build(TOPO), sources[:1], {receivers[0]: 0.0}, SIZE, {sources[0]: copy / 2}
        )


def test_rack_mates_follow_the_racks_first_receiver_in_a_chain() -> None:
    c = Cluster.build(TOPO)
    hosts = sorted(c.hosts)
    source, rack = hosts[0], hosts[4:8]
    chunk = 4e6
    done = rack_chains(c, [source], dict.fromkeys(rack, 0.0), SIZE, {}, chunk)
    head = done[rack[0]]
    assert head == pytest.approx(SIZE / NIC, rel=0.01)
    for i, r in enumerate(rack):
        assert done[r] == pytest.approx(head + i * (chunk / NIC + c.latency(rack[0], r)))


def test_relay_then_ring_waits_for_the_barrier_and_never_outruns_the_wan() -> None:
    # No per-connection window: two trainers' two connections would hold the relay to 2
    # windows per RTT (test_sim_workloads.py checks windows); here the WAN sets the pace.
    topo = TopologySpec(dcs=2, racks_per_dc=2, hosts_per_rack=4, wan_gbytes=1.0,
                        wan_window_mib=0)  # fmt: skip
    sc = Scenario(name="x", kind="crossdc", model_gb=8, trainer_hosts=2, rollout_hosts=4,
                  remote_rollouts=3, topology=topo)  # fmt: skip
    c = Cluster.build(topo)
    dc1 = sorted(c.in_dc(1))
    trainers, remote, relay = sorted(c.in_dc(0))[:2], dc1[:3], dc1[3]
    hop = sc.nccl_chunk_mb * 1e6 / sc.nic + 4 * topo.hop_latency
    crossing = SIZE / 1e9  # the WAN, slower than a NIC, sets the relay's pace
    early = dict.fromkeys(remote, 0.0)
    stalls, _, wan = relay_then_ring(sc, trainers, relay, remote, early)
    assert max(stalls.values()) == pytest.approx(crossing + 3 * hop, rel=0.01)
    assert wan == pytest.approx(SIZE)  # one copy crosses
    late = {r: 100.0 + i for i, r in enumerate(remote)}  # the relay is done long before
    stalls, _, _ = relay_then_ring(sc, trainers, relay, remote, late)
    ring = ring_broadcast(SIZE, 4, sc.nic, sc.nccl_chunk_mb * 1e6, 4 * topo.hop_latency)
    assert stalls[remote[-1]] == pytest.approx(ring)  # the last to pause waits for no one
    assert stalls[remote[0]] == pytest.approx(2 + ring)  # the first waits for the barrier


def test_snapshot_and_staging_copies_run_at_pcie_rate_per_gpu() -> None:
    sc = Scenario(name="x", kind="standalone", model_gb=50, trainer_hosts=32, pcie_gbytes=25)
    assert snapshot_s(sc) == pytest.approx(50e9 / 32 / (8 * 25e9))
    assert h2d_s(sc) == pytest.approx(50e9 / (8 * 25e9))


def test_every_workload_reports_its_strong_baselines_under_one_accounting() -> None:
    small = SwarmConfig(chunks=16, peers=6)
    scs = [
        Scenario(name="standalone", kind="standalone", model_gb=8, trainer_hosts=4,
                 rollout_hosts=10, topology=TOPO, swarm=small),
        Scenario(name="elastic", kind="elastic", model_gb=8, trainer_hosts=2, rollout_hosts=6,
                 joiners=8, preempt=0.3, topology=TOPO, swarm=small),
        Scenario(name="crossdc", kind="crossdc", model_gb=8, trainer_hosts=4, rollout_hosts=10,
                 remote_rollouts=5, swarm=small,
                 topology=TopologySpec(dcs=2, racks_per_dc=3, hosts_per_rack=4)),
    ]  # fmt: skip
    outs = [run(sc.replace(seed=s)) for sc in scs for s in (1, 2, 3)]
    names = {
        "standalone": {"storage, 8 NICs", "ucx + snapshot", "nccl staged"},
        "elastic": {"rack p2p chains", "nccl, no rebuild"},
        "crossdc": {"wan relay + ring"},
    }
    for o in outs:
        assert o.ratio_vs(o.baseline) == pytest.approx(o.ratio)  # a sweep's vs= uses this
        versus = o.extra["versus"]
        assert set(versus) == names[o.scenario.name]
        assert all(0 < r < float("inf") for r in versus.values())
        assert o.extra["strongest"] == min(versus, key=lambda n: (versus[n], n))
    rows = {h.scenario: h for h in headlines(outs)}
    assert all(h.seeds == 3 for h in rows.values())
    strongest = rows["elastic"].strongest
    assert strongest is not None and strongest[0] in names["elastic"]
    # The report renders the same table from a reproduce JSON, and names every loss.
    data = json.loads(json.dumps({"headlines": [h.summary() for h in rows.values()]}))
    again = from_json(data)
    assert [h.summary() for h in again] == [h.summary() for h in rows.values()]
    md = "\n".join(strongest_section(again, "python -m sim reproduce --seeds 3"))
    assert "| vs paper's kind | strongest baseline | vs strongest |" in md
    lost = [(h.scenario, n) for h in again for n, v in h.versus.items() if v.median < 1]
    for scenario, name in lost:
        assert f"- **{scenario}: {name}," in md
    if not lost:
        assert "- nowhere in these scenarios." in md


def test_a_spread_is_the_median_and_quartiles() -> None:
    assert Spread.of([3.0]) == Spread(3.0, 3.0, 3.0)
    s = Spread.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.median, s.q1, s.q3) == (3.0, 2.0, 4.0)
    assert s.text(1) == "3.0x [2.0-4.0]"
