"""The trainer unpublishing, in one step and in steps in a row (sim/steady.py), and what
it rests on: a holder that lets go of a version in the simulated swarm
(``Swarm.withdraw``, as ``Hub.unpublish``), the first full copy elsewhere
(``when_replicated``), and the network not completing a cancelled flow."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from sim.__main__ import SCENARIOS, main
from sim.engine import Engine
from sim.network import Link, Network, Transfer
from sim.scenario import Scenario, load
from sim.steady import SCHEMES, steady
from sim.swarm import Swarm
from sim.topology import GB, Cluster, TopologySpec
from sim.workloads import _nccl, _place, run
from tests.test_sim_swarm import CFG


def small(seed: int) -> Scenario:
    return load(SCENARIOS / "standalone.yaml").replace(
        seed=seed,
        trainer_hosts=4,
        rollout_hosts=12,
        model_gb=10,
        **{"topology.racks_per_dc": 4, "swarm.chunks": 32},
    )


def test_a_flow_cancelled_after_its_last_byte_is_not_completed() -> None:
    """Two flows land at the same instant; the first one's ``done`` cancels the second
    (a fetcher abandoning an endgame twin): the second's ``done`` must not run too. It did,
    and released its sender's upload slot twice (a count of -1 that never drained)."""
    e = Engine()
    net = Network(e)
    done: list[str] = []
    later: list[Transfer] = []

    def first() -> None:
        done.append("a")
        net.cancel(later[0])

    net.start([Link("x", 100.0)], 100, first)  # (flows that land together: in start order)
    later.append(net.start([Link("y", 100.0)], 100, lambda: done.append("b")))
    e.run()
    assert done == ["a"]
    assert not net.flows


def _swarm(seed: int) -> tuple[Swarm, Engine, list[str]]:
    e = Engine()
    c = Cluster.build(TopologySpec(racks_per_dc=2, hosts_per_rack=4))
    hosts = sorted(c.hosts)
    s = Swarm(e, Network(e), c, 8 * GB, [hosts[0]], hosts[1:], CFG, seed=seed)
    return s, e, hosts


def test_a_withdrawn_origin_finishes_its_uploads_then_serves_nothing(seed: int) -> None:
    s, e, hosts = _swarm(seed)
    origin = s.nodes[hosts[0]]
    drained: list[float] = []
    withdrew: list[float] = []

    def unpublish() -> None:  # as the README's trainer: wait_replicated, then unpublish
        withdrew.append(e.now)
        s.withdraw(hosts[0], lambda: drained.append(e.now))

    s.start()
    s.when_replicated(unpublish)
    e.run(until=600)
    assert s.done, "the fetchers finish from each other"
    assert len(drained) == 1 and drained[0] >= withdrew[0]
    assert withdrew[0] < max(s.nodes[f].finished or 0.0 for f in s.fetchers)
    assert origin.slots.active == 0 and origin.slots.waiting == 0
    # The holder view lists it no more: a fetcher still fetching once that news is out
    # plans without it.
    late = [f for f in s.fetchers if (s.nodes[f].finished or 0.0) > withdrew[0] + CFG.hint_delay]
    for f in late:
        p = s.nodes[f].planner
        assert p is not None and hosts[0] not in p.sources, f
    # Nothing it sent arrived after it drained (its last upload ended then).
    assert origin.last_sent <= drained[0]
    with pytest.raises(ValueError, match="no replica"):
        s.withdraw(hosts[0])


def test_replicated_once_a_full_copy_is_elsewhere(seed: int) -> None:
    s, e, _hosts = _swarm(seed)
    when: list[float] = []
    s.when_replicated(lambda: when.append(e.now))
    with pytest.raises(ValueError, match="already waiting"):  # one waiter at a time
        s.when_replicated(lambda: None)
    s.start()
    e.run(until=600)
    first_done = min(s.nodes[f].finished or float("inf") for f in s.fetchers)
    assert len(when) == 1 and 0 < when[0] <= first_done
    later: list[float] = []
    s.when_replicated(lambda: later.append(e.now))  # already: at once
    assert later == [e.now]


def test_steps_in_a_row_every_instance_gets_every_version(seed: int) -> None:
    sc = small(seed)
    o = steady(sc, 3)
    th, nccl = o.runs["tensorhub"], o.runs["nccl"]
    for name, r in o.runs.items():
        assert len(r.publish) == 3 and len(r.free) == 3, name
        assert all(b - a >= sc.train_step_s - 1e-9 for a, b in itertools.pairwise(r.publish))
        assert all(f >= p for p, f in zip(r.publish, r.free, strict=True)), name
        assert all(v > 0 for step in r.rollout_stall for v in step.values()), name
    # Releasing at the next step, once replicated, never keeps the trainer longer than
    # serving every fetch does.
    serves_all = o.runs["tensorhub, serves all"]
    assert sum(th.trainer_stall) <= sum(serves_all.trainer_stall) + 1e-9
    # Step 0 of the loop is the one-step run: the same pauses, the same ring.
    c = Cluster.build(sc.topology)
    trainers, rollouts, _ = _place(sc, c)
    pause = dict(zip(rollouts, sc.generation_times(len(rollouts)), strict=True))
    one = _nccl(sc, pause, sc.nic, len(trainers) + len(rollouts))
    assert nccl.rollout_stall[0] == pytest.approx(one.rollout_stall)
    assert nccl.trainer_stall[0] == pytest.approx(one.trainer_stall)


def test_steps_in_a_row_are_deterministic(seed: int) -> None:
    sc = small(seed)
    assert steady(sc, 2).summary() == steady(sc, 2).summary()


def test_steady_cli_writes_json_and_refuses_other_kinds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "steady.json"
    args = ["--set", "trainer_hosts=4", "--set", "rollout_hosts=12", "--set", "model_gb=10"]
    args += ["--set", "topology.racks_per_dc=4", "--set", "swarm.chunks=32"]
    assert main(["steady", "--steps", "2", *args, "--json", str(out)]) == 0
    assert "2 steps in a row" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["seeds"] == [1] and len(data["runs"]) == 1
    assert set(data["runs"][0]["schemes"]) == set(data["over_seeds"]) == set(SCHEMES)
    assert data["runs"][0]["steps"] == 2 and data["wall_s"] >= 0
    assert main(["steady", str(SCENARIOS / "elastic.yaml"), "--steps", "2"]) == 2
    assert main(["steady", "--steps", "1"]) == 2
    assert main(["steady", "--seeds", "2", "--seed", "3"]) == 2


def test_trainers_unpublishing_stall_less_and_send_less_than_serving_every_fetch() -> None:
    """One step (``Scenario.trainer_unpublishes``): released at the next optimizer step
    once a full copy is elsewhere, the trainers stall no longer and send no more than
    when they serve every fetch; the rollouts finish from each other."""
    sc = small(1)
    out = {u: run(sc.replace(trainer_unpublishes=u)) for u in (True, False)}
    mine = {u: o.schemes["tensorhub"] for u, o in out.items()}
    assert mine[True].trainer_stall <= mine[False].trainer_stall
    egress = {u: o.extra["trainer_egress_copies"] for u, o in out.items()}
    assert egress[True] <= egress[False]


def test_crossdc_seed_1_trainers_unpublish_without_a_livelock() -> None:
    """Regression (seed 1 of the cross-DC scenario): once the trainers let go, four
    chunks were held only by first-datacenter rollouts, out of sight of every fetcher in
    the second (each knows its ``peers`` nearest); they asked the withdrawn trainers for
    ever (50 M events). An "unknown version" reply now names a live holder of the chunk,
    as the real holder view lists every holder."""
    sc = load(SCENARIOS / "crossdc.yaml").replace(seed=1, strong_baselines=False)
    o = run(sc)  # (raises if a fetcher did not finish)
    assert o.events < 1_000_000
    assert all(v < float("inf") for v in o.schemes["tensorhub"].rollout_stall.values())
