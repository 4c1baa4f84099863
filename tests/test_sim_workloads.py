"""The paper's workloads in the simulator: baselines against their closed forms, every scheme
against its lower bound, the WAN carrying about one copy, determinism, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.__main__ import SCENARIOS, main
from sim.baselines import pull_from_trainer, push_then_pull, ring_broadcast
from sim.control import commit_publish, spread_version
from sim.report import Sweep, fit, markdown, plot, sweep, sweep_points
from sim.scenario import Scenario, from_dict, load
from sim.swarm import SwarmConfig
from sim.topology import GB, Cluster, TopologySpec
from sim.workloads import run

SMALL = SwarmConfig(chunks=16, peers=6)
TOPO = TopologySpec(racks_per_dc=4, hosts_per_rack=4)


def small(kind: str, seed: int = 1, **kw: object) -> Scenario:
    """A small scenario of ``kind``. On the GPUDirect data plane unless ``dataplane`` says
    otherwise: these tests check the design (the swarm against the bound and the
    baselines at the same NIC rate); the TCP data plane as built has tests of its own."""
    kw.setdefault("dataplane", "gpudirect")
    base: dict[str, object] = {
        "standalone": dict(trainer_hosts=4, rollout_hosts=10),
        "elastic": dict(trainer_hosts=2, rollout_hosts=6, joiners=8, preempt=0.3),
        "crossdc": dict(trainer_hosts=4, rollout_hosts=10, remote_rollouts=5),
    }[kind]
    topo = TOPO if kind != "crossdc" else TopologySpec(dcs=2, racks_per_dc=3, hosts_per_rack=4)
    fields = {**base, **kw}
    return Scenario(
        name=kind, kind=kind, model_gb=8, topology=topo, swarm=SMALL, seed=seed, **fields
    )  # type: ignore[arg-type]


def test_ucx_fan_out_matches_the_closed_form() -> None:
    """k joiners pulling from T trainer hosts at once: k*S/(T*B) when k > T (paper 12.3)."""
    c = Cluster.build(TOPO)
    hosts = sorted(c.hosts)
    trainers, joiners = hosts[:2], hosts[2:10]
    p = pull_from_trainer(c, trainers, dict.fromkeys(joiners, 0.0), 8 * GB)
    nic = TOPO.nic_gbytes * GB * TOPO.efficiency
    expect = len(joiners) * 8 * GB / (len(trainers) * nic)
    assert max(p.done.values()) == pytest.approx(expect, rel=0.02)


def test_storage_moves_every_byte_twice_and_reads_wait_for_the_push() -> None:
    c = Cluster.build(TOPO)
    hosts = sorted(c.hosts)
    p = push_then_pull(c, hosts[:4], dict.fromkeys(hosts[4:8], 0.0), 8 * GB, storage_hosts=2)
    nic = TOPO.nic_gbytes * GB * TOPO.efficiency
    assert p.senders_free == pytest.approx(8 * GB / (2 * nic), rel=0.02)  # store's NICs
    assert min(p.done.values()) >= p.senders_free + 8 * GB / nic * 0.99


def test_ring_broadcast_is_one_copy_time_plus_the_pipeline_fill() -> None:
    assert ring_broadcast(100.0, 1, 10.0, 1.0, 0.0) == 10.0
    assert ring_broadcast(100.0, 11, 10.0, 1.0, 0.0) == pytest.approx(11.0)


@pytest.mark.parametrize("kind", ["standalone", "elastic", "crossdc"])
def test_no_scheme_beats_the_lower_bound_and_tensorhub_beats_its_baseline(
    kind: str, seed: int
) -> None:
    o = run(small(kind, seed=seed % 1000))
    lb = o.schemes["lower_bound"].rollout_stall
    for name, s in o.schemes.items():
        for r, stall in s.rollout_stall.items():
            assert stall >= lb[r] * 0.999, (name, r, stall, lb[r])
    assert o.ratio > 1.0, o.summary()
    assert o.over_lb_mean >= 0.999


def test_elastic_joiners_finish_despite_preempted_holders(seed: int) -> None:
    o = run(small("elastic", seed=seed % 1000, preempt=0.5))
    assert o.extra["preempted_holders"] == 3
    assert len(o.schemes["tensorhub"].rollout_stall) == 8  # invariants checked inside run


@pytest.mark.parametrize("seed", [7, 10, 18, 184, 241, 298])
def test_elastic_preemption_regression_seeds(seed: int) -> None:
    """Seeds of the test above that hung (CI: TENSORHUB_SEED=686980184, i.e. 184; and
    769988298, i.e. 298). A node whose source died mid-chunk had already settled the chunk
    when a follower's bytes, outrunning the cancelled stream, arrived and parked on it for
    ever (7); once their source died, two rack-mates passed each other the bytes they had
    each been passing on, then waited on each other (10, 184, 241); a node whose first
    request for a chunk was lost parked its rack-mates' requests for it, holding nothing
    yet (``starting``), and left the chunk to the rack-mate that owns its way into the
    rack, which waited on it (18, 298; 83 of seeds 0-999 before ``started_parks``)."""
    o = run(small("elastic", seed=seed, preempt=0.5))
    assert len(o.schemes["tensorhub"].rollout_stall) == 8  # invariants checked inside run


def test_across_datacenters_tensorhub_crosses_the_wan_about_once_into_each(seed: int) -> None:
    """Into the remote datacenter about once. Into the trainers' own datacenter only what
    none of its nodes held when the trainers let go (at their next step: their memory is
    the step's), about once at most: then the remote seed's copy was the only one."""
    sc = small("crossdc", seed=seed % 1000)
    o = run(sc)
    into = o.extra["wan_copies_into"]
    assert into["dc1"] <= 1.3 and into["dc0"] <= 1.3, into
    assert o.schemes["naive"].wan_bytes == pytest.approx(sc.remote_rollouts * sc.size, rel=1e-6)


@pytest.mark.parametrize("seed", [10, 731])
def test_a_version_whose_only_copy_crossed_comes_back_once(seed: int) -> None:
    """Seeds of the test above (CI: TENSORHUB_SEED=2302223731, i.e. 731; 36 of seeds
    0-999, 10 the first) where the whole version crossed the WAN twice, which it asserted
    could not happen: every local rollout pauses after the trainers let go, so the
    remote seed's copy is the only one left and each chunk comes back once. Once each
    way, not more."""
    sc = small("crossdc", seed=seed)
    local = sc.generation_times(sc.rollout_hosts)[: sc.rollout_hosts - sc.remote_rollouts]
    assert min(local) > sc.train_step_s  # what makes the return trip needed
    into = run(sc).extra["wan_copies_into"]
    assert into == {"dc0": pytest.approx(1.0, abs=0.01), "dc1": pytest.approx(1.0, abs=0.01)}


def test_the_trace_hash_covers_the_baselines() -> None:
    """#18: a change to a baseline alone (the store's hosts) changes the hash, though
    TensorHub's run is the same event for event."""
    sc = small("standalone", 3)
    a, b = run(sc), run(sc.replace(storage_hosts=1))
    assert a.schemes["tensorhub"] == b.schemes["tensorhub"] and a.events == b.events
    assert a.schemes["storage"] != b.schemes["storage"]
    assert a.trace_hash != b.trace_hash


def test_same_seed_same_trace_hash() -> None:
    a, b, c = run(small("standalone", 3)), run(small("standalone", 3)), run(small("standalone", 4))
    assert a.trace_hash == b.trace_hash
    assert a.summary() == b.summary()
    assert a.trace_hash != c.trace_hash


def test_scenario_files_load_and_bad_fields_are_named() -> None:
    for name in ("standalone", "elastic", "crossdc"):
        sc = load(Path("sim/scenarios") / f"{name}.yaml")
        assert sc.kind == name
    faults = load("sim/scenarios/crossdc-faults.yaml")
    assert faults.leader_crash and faults.wan_outage_s == (0.0, 20.0)
    with pytest.raises(ValueError, match="unknown scenario fields: \\['modelgb'\\]"):
        from_dict({"kind": "standalone", "modelgb": 3})
    with pytest.raises(ValueError, match="kind must be one of"):
        from_dict({"kind": "broadcast"})
    with pytest.raises(ValueError, match="crossdc needs"):
        from_dict({"kind": "crossdc"})
    with pytest.raises(ValueError, match="needs 200 hosts"):
        run(small("standalone", rollout_hosts=196))
    # The planner's knobs, from YAML or --set, over the simulator's defaults.
    tuned = from_dict({"kind": "standalone", "swarm": {"chunks": 128, "planner": {"total": 9}}})
    assert (tuned.swarm.chunks, tuned.swarm.planner.total) == (128, 9)
    assert (
        tuned.swarm.planner.owner_timeout
        == Scenario(name="x", kind="standalone").swarm.planner.owner_timeout
    )
    assert tuned.replace(**{"swarm.planner.per_source": 2}).swarm.planner.per_source == 2
    with pytest.raises(ValueError, match=r"unknown swarm\.planner fields: \['totl'\]"):
        from_dict({"kind": "standalone", "swarm": {"planner": {"totl": 9}}})
    assert fit(small("standalone", rollout_hosts=196)).topology.racks_per_dc == 50


def test_cli_run_writes_json_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.json"
    args = ["run", "sim/scenarios/elastic.yaml", "--set", "joiners=8", "--set", "rollout_hosts=8"]
    assert main([*args, "--set", "swarm.chunks=16", "--set", "dataplane=gpudirect",
                 "--json", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["kind"] == "elastic" and data["dataplane"] == "gpudirect" and data["ratio"] > 1
    assert "tensorhub" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: standalone\nnics: 3\n")
    assert main(["run", str(bad)]) == 2
    assert "unknown scenario fields" in capsys.readouterr().err


def test_reproduce_reports_each_ratio_beside_the_papers(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["reproduce", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    res = {r["scenario"]: r for r in data["results"]}
    assert set(res) == {"standalone", "elastic", "crossdc", "broadcast"}
    heads = {h["scenario"]: h for h in data["headlines"]}
    for name in ("standalone", "elastic", "crossdc"):  # two columns for every headline
        assert heads[name]["vs_paper_kind"]["median"] == pytest.approx(res[name]["ratio"], abs=0.01)
        strongest = heads[name]["strongest_baseline"]
        assert strongest == res[name]["strongest"]
        assert heads[name]["vs_strongest"]["median"] == res[name]["versus"][strongest]
        assert heads[name]["vs_strongest"]["median"] < heads[name]["vs_paper_kind"]["median"]
    assert heads["broadcast"]["strongest_baseline"] is None  # not a headline: none run
    assert [res[k]["paper_ratio"] for k in ("standalone", "elastic", "crossdc")] == [6.7, 4.8, 19]
    assert res["broadcast"]["paper_ratio"] is None  # ours: the swarm with nothing to hide
    # As built, a node moves no faster than its TCP data plane: away from the WAN every
    # TensorHub rollout is at least NIC / node rate over the (NIC) bound.
    sc = load(SCENARIOS / "standalone.yaml")
    floor = sc.nic / (sc.tcp_node_gbytes * 1e9)
    for name, r in res.items():
        assert r["dataplane"] == "tcp"
        least = floor if name != "crossdc" else 1.0
        assert r["tensorhub_over_lower_bound_mean"] >= least * 0.999, name
    hyp = {r["scenario"]: r for r in data["gpudirect_results"]}
    assert set(hyp) == set(res) and all(r["dataplane"] == "gpudirect" for r in hyp.values())
    for name, r in hyp.items():  # the design, at the NIC's rate
        assert r["tensorhub_over_lower_bound_mean"] >= 1
        assert r["ratio"] > 1 or name == "broadcast"
        hyp_ratio = heads[name]["gpudirect_vs_paper_kind"]["median"]
        assert hyp_ratio == pytest.approx(r["ratio"], abs=0.01)
        assert r["ratio"] > res[name]["ratio"]  # the hypothetical data plane is faster
    # The acceptance target: the last receiver of a pure broadcast within 1.15x the bound.
    assert hyp["broadcast"]["tensorhub_over_lower_bound_worst"] <= 1.15
    # Run in parallel processes, a scenario traces as it does run here, alone.
    alone = run(load(SCENARIOS / "standalone.yaml"))
    assert res["standalone"]["trace_hash"] == alone.trace_hash


def test_control_plane_runs_the_real_raft_and_gossip_cores(seed: int) -> None:
    s = seed % 1000
    calm, crash = commit_publish(s), commit_publish(s, leader_crash=True)
    assert crash.leader_changes == 1 and crash.seconds > calm.seconds  # an election first
    assert commit_publish(s) == calm  # seeded: the same trace
    spread = spread_version(s, 40)
    assert len(spread.seconds) == 40 and spread.seconds[0] == 0 and max(spread.seconds) > 0


def test_a_leader_crash_delays_the_fetches_not_their_outcome(seed: int) -> None:
    calm = run(small("standalone", seed=seed % 1000))
    crash = run(small("standalone", seed=seed % 1000, leader_crash=True))
    assert crash.extra["control"]["leader_changes"] == 1
    assert crash.extra["control"]["commit_s"] > calm.extra["control"]["commit_s"]
    assert crash.schemes["tensorhub"].mean() >= calm.schemes["tensorhub"].mean()


def _wan_outage(seed: int) -> None:
    sc = small("crossdc", seed=seed, remote_seed=False)
    calm = run(sc)
    cut = run(sc.replace(wan_outage_s=(0.0, 40.0)))  # before any remote rollout pauses
    remote = [h for h in cut.schemes["tensorhub"].rollout_stall if h.startswith("h1.")]
    assert remote
    # About one copy into each datacenter (invariants checked in run), not one in all: as
    # in test_across_datacenters_tensorhub_crosses_the_wan_about_once_into_each, what no
    # node of the trainers' datacenter held when the trainers let go comes back from the
    # remote one (seed 491).
    into = cut.extra["wan_copies_into"]
    assert into["dc1"] <= 1.3 and into["dc0"] <= 1.3, into
    mine, before = cut.schemes["tensorhub"].rollout_stall, calm.schemes["tensorhub"].rollout_stall
    # The remote datacenter as a whole stalls longer. Not each rollout: one that pauses
    # late can find its datacenter already served and its links quieter than in the calm
    # run (seed 432: 0.386 s against 0.409 s), so a per-rollout comparison is no law.
    assert sum(mine[h] for h in remote) > sum(before[h] for h in remote)
    assert cut.schemes["naive"].mean() > calm.schemes["naive"].mean()


def test_a_wan_outage_stalls_the_remote_dc_and_it_still_finishes_with_one_copy(seed: int) -> None:
    _wan_outage(seed % 1000)


def test_wan_outage_regression_seed_491() -> None:
    """TENSORHUB_SEED=1075491491 (a fresh-clone CI run, session 43; it failed at 50985ea
    too): 1.375 models crossed the WAN, against the 1.3 the test asserted in all. The
    first local rollout paused 0.33 s before the trainers let go, and took part of the
    version from them; the rest was nowhere in their datacenter and came back from the
    remote one once the outage ended. Once each way, not more (seeds 0-999: at most 0.38
    into dc0, 1.06 into dc1; five over 1.3 in all, each with 0.37-0.38 into dc0)."""
    sc = small("crossdc", seed=491, remote_seed=False)
    local = sc.generation_times(sc.rollout_hosts)[: sc.rollout_hosts - sc.remote_rollouts]
    assert sc.train_step_s - 1.0 < min(local) < sc.train_step_s  # what makes it happen
    _wan_outage(491)
    into = run(sc.replace(wan_outage_s=(0.0, 40.0))).extra["wan_copies_into"]
    assert 0.0 < into["dc0"] < 1.0 and into["dc1"] == pytest.approx(1.0, abs=0.01), into


def test_wan_outage_regression_seed_432() -> None:
    """TENSORHUB_SEED=1979059432 (a fresh-clone run, session 8; it failed at 241d7d3 too):
    one late remote rollout stalled 23 ms less with the outage than without."""
    _wan_outage(432)


def test_a_sweep_moves_one_parameter_and_reports_it_with_a_plot(tmp_path: Path) -> None:
    sw = Sweep("tail", "standalone", "gen_sigma", (0.05, 0.6), "sigma", "why")
    points = sweep(small("standalone"), sw)
    assert [v for v, _ in points] == [0.05, 0.6]
    assert [o.scenario.gen_sigma for _, o in points] == [0.05, 0.6]
    assert points[1][1].ratio > points[0][1].ratio  # a longer tail: a longer barrier wait
    png = tmp_path / "tail.png"
    plot(sw, points, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = markdown([points[0][1]], [(sw, points)], {sw.key: "tail.png"}, "test")
    assert "| 0.6 |" in md and "![standalone tail](tail.png)" in md and "## Assumptions" in md
    held = Sweep("tail", "standalone", "gen_sigma", (0.6,), "sigma", "why",
                 sets=(("dataplane", "tcp"),))  # fmt: skip
    ((_, sc),) = sweep_points(small("standalone"), held)
    assert (sc.gen_sigma, sc.dataplane) == (0.6, "tcp") and held.title.endswith("[dataplane=tcp]")


def test_a_sweep_over_a_switch_or_a_zero_plots_as_categories(tmp_path: Path) -> None:
    sw = Sweep("queue", "standalone", "swarm.max_waiting", (0, 4), "queued", "why")
    points = sweep(small("standalone"), sw)
    assert [o.scenario.swarm.max_waiting for _, o in points] == [0, 4]
    png = tmp_path / "queue.png"
    plot(sw, points, png)  # 0 has no place on a log axis
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    spare = Sweep("spare", "standalone", "swarm.seed_spare", (True, False), "spare", "why")
    flips = sweep(small("standalone"), spare)
    plot(spare, flips, tmp_path / "spare.png")
    assert "| False |" in markdown([flips[0][1]], [(spare, flips)], {}, "test")


def test_deltas_shrink_what_crosses_the_wan_and_the_remote_stall() -> None:
    full = run(small("crossdc", strong_baselines=False))
    delta = run(small("crossdc", strong_baselines=False, delta_fraction=0.05))
    th_full, th_delta = full.schemes["tensorhub"], delta.schemes["tensorhub"]
    assert th_delta.wan_bytes == pytest.approx(0.05 * th_full.wan_bytes, rel=0.2)
    assert th_delta.total_stall(delta.scenario) < th_full.total_stall(full.scenario) / 4
    with pytest.raises(ValueError, match="delta_fraction"):
        small("crossdc", delta_fraction=0.0)


def test_as_built_each_node_moves_at_its_measured_tcp_rate_and_the_baselines_do_not() -> None:
    """#18: the TCP data plane as built is the default. Every TensorHub rollout takes at
    least a copy at the node's measured rate; the baselines, which run on RDMA today, are
    the same run for run as beside the hypothetical GPUDirect data plane."""
    tcp = run(small("standalone", dataplane="tcp"))
    gd = run(small("standalone", dataplane="gpudirect"))
    sc = tcp.scenario
    assert Scenario(name="x", kind="standalone").dataplane == "tcp"  # the default
    assert all(load(path).dataplane == "tcp" for path in SCENARIOS.glob("*.yaml"))
    copy = sc.size / (sc.tcp_node_gbytes * 1e9)
    assert min(tcp.schemes["tensorhub"].rollout_stall.values()) >= copy * 0.999
    assert min(gd.schemes["tensorhub"].rollout_stall.values()) < copy / 2
    for name in ("nccl", "ucx", "storage", "lower_bound"):
        assert tcp.schemes[name] == gd.schemes[name], name
    with pytest.raises(ValueError, match="dataplane"):
        small("standalone", dataplane="rdma")


def test_a_wan_connection_moves_one_receive_window_per_round_trip() -> None:
    """TCP windows on the WAN: one host pair's flows share one connection that moves at
    most ``wan_window_mib`` per RTT, while two pairs fill twice that."""
    from sim.engine import Engine
    from sim.network import Network

    spec = TopologySpec(dcs=2, racks_per_dc=1, hosts_per_rack=2, wan_gbytes=1.25, wan_rtt=0.03)
    window = 6 * 2**20 / 0.03
    assert spec.wan_connection == pytest.approx(window)

    def last_done(pairs: int, flows_each: int) -> float:
        c = Cluster.build(spec)
        e = Engine()
        net = Network(e)
        done: list[float] = []
        for i in range(pairs):
            for _ in range(flows_each):
                net.start(c.path(f"h0.0.{i}", f"h1.0.{i}"), GB, lambda: done.append(e.now))
        e.run()
        return max(done)

    for pairs, flows_each in ((1, 1), (1, 3), (2, 1)):
        expect = flows_each * GB / window  # the pair's connection is the bottleneck
        assert last_done(pairs, flows_each) == pytest.approx(expect, rel=1e-6)
    unlimited = Cluster.build(TopologySpec(dcs=2, wan_window_mib=0))
    assert not any(link.name.startswith("tcp/") for link in unlimited.path("h0.0.0", "h1.0.0"))


def test_rack_uplinks_that_cannot_bind_are_left_out_and_change_no_rate() -> None:
    """Hosts capped below line rate (TCP as built) cannot together fill a 2:1 rack uplink,
    so paths skip it: the same max-min rates, with fewer links per flow."""
    from sim.engine import Engine
    from sim.network import Network

    spec = TopologySpec(racks_per_dc=3, hosts_per_rack=4)
    capped = Cluster.build(spec, host_rate=3.05e9)
    assert not capped.racks_bind and len(capped.path("h0.0.0", "h0.1.0")) == 2
    assert Cluster.build(spec).racks_bind and len(Cluster.build(spec).path("h0.0.0", "h0.1.0")) == 4
    assert Cluster.build(spec, host_rate=30e9).racks_bind  # above the NIC: the NIC's rate

    def finish_times(skip: bool) -> list[float]:
        c = Cluster.build(spec, host_rate=3.05e9)
        c.racks_bind = not skip
        e = Engine()
        net = Network(e)
        done: list[float] = []
        pairs = [(a, b) for a in sorted(c.hosts)[:6] for b in sorted(c.hosts)[6:]]
        for i, (a, b) in enumerate(pairs):
            net.start(c.path(a, b), (1 + i % 3) * GB, lambda: done.append(e.now))
        e.run()
        return done

    assert finish_times(skip=True) == finish_times(skip=False)
