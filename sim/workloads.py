"""The paper's three workloads, each run with TensorHub (the real planner, super-seeder and
upload slots on the flow network) and with its baselines, against a lower bound.

Stall, as the paper counts it (GPU-seconds, ``gpus_per_host`` GPUs per host):

- a rollout GPU stalls from the moment its instance pauses generation (its generation
  time, drawn from a long-tailed distribution) until the new weights are in place;
- a trainer GPU stalls from the end of its next step's compute (``train_step_s`` after the
  publish) until it may mutate the published buffers, i.e. until the last byte it serves
  has left (TensorHub, UCX), its push finished (storage) or the broadcast ended (NCCL).

Weight-update latency (elastic) is from a joiner's arrival to its copy being complete.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from .baselines import Pulls, pull_from_trainer, push_then_pull, wan_outage
from .control import commit_publish, spread_version
from .engine import Engine
from .network import Network
from .scenario import Scenario
from .strong import (
    Versus,
    nccl_ring_s,
    rack_chains,
    relay_then_ring,
    snapshot_trainer_stall,
    staged_stalls,
    strongest,
)
from .swarm import Swarm
from .topology import Cluster

PAPER = {"standalone": 6.7, "elastic": 4.8, "crossdc": 19.0}
"""The paper's headline ratios ("up to"), printed beside ours."""


@dataclass
class Scheme:
    """What one system did in one scenario."""

    name: str
    rollout_stall: dict[str, float] = field(default_factory=dict)  # per instance, seconds
    trainer_stall: float = 0.0  # per trainer GPU, seconds
    wan_bytes: float = 0.0

    def total_stall(self, sc: Scenario, hosts: list[str] | None = None) -> float:
        """GPU-seconds stalled (rollouts in ``hosts`` only if given; else all plus trainer)."""
        if hosts is not None:
            return sc.gpus_per_host * sum(self.rollout_stall[h] for h in hosts)
        rollouts = sum(self.rollout_stall.values())
        return sc.gpus_per_host * (rollouts + sc.trainer_hosts * self.trainer_stall)

    def mean(self) -> float:
        return sum(self.rollout_stall.values()) / len(self.rollout_stall)

    def worst(self) -> float:
        return max(self.rollout_stall.values())


@dataclass
class Outcome:
    """One scenario's schemes, headline ratio and TensorHub's distance from the bound."""

    scenario: Scenario
    schemes: dict[str, Scheme]
    headline: str  # which figure the paper's ratio is compared with
    baseline: str
    over_lb_mean: float  # TensorHub's mean weight update over the lower bound's
    over_lb_worst: float
    trace_hash: str
    events: int
    extra: dict[str, Any] = field(default_factory=dict)
    # How the headline figure is taken from a scheme: summed stall (of ``focus`` hosts
    # only, if given) or the mean update latency. ``ratio_vs`` uses it for any baseline.
    metric: str = "total"  # total | mean
    focus: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # The trace hash covers every scheme, the baselines included (#18): TensorHub's
        # event trace, then each scheme's stalls and WAN bytes and the strong baselines'
        # figures (``extra``), so a change to a baseline's model changes the hash too.
        h = xxhash.xxh3_64(self.trace_hash.encode())
        for name in sorted(self.schemes):
            s = self.schemes[name]
            stalls = sorted((k, round(v, 9)) for k, v in s.rollout_stall.items())
            h.update(repr((name, stalls, round(s.trainer_stall, 9), round(s.wan_bytes))).encode())
        h.update(repr(self.extra).encode())
        self.trace_hash = h.hexdigest()

    def figure(self, scheme: str) -> float:
        s = self.schemes[scheme]
        if self.metric == "mean":
            return s.mean()
        return s.total_stall(self.scenario, list(self.focus) if self.focus else None)

    def ratio_vs(self, baseline: str) -> float:
        """``baseline``'s headline figure over TensorHub's (above 1: TensorHub better)."""
        return self.figure(baseline) / self.figure("tensorhub")

    @property
    def ratio(self) -> float:
        """The headline: the paper's kind of baseline over TensorHub on that figure."""
        return self.ratio_vs(self.baseline)

    @property
    def paper(self) -> float | None:
        """The paper's figure for this scenario (None: not one of its three results)."""
        return PAPER.get(self.scenario.name)

    def summary(self) -> dict[str, Any]:
        sc = self.scenario
        return {
            "scenario": sc.name,
            "kind": sc.kind,
            "headline": self.headline,
            "baseline": self.baseline,
            "ratio": round(self.ratio, 2),
            "paper_ratio": self.paper,
            "dataplane": sc.dataplane,
            "tensorhub_over_lower_bound_mean": round(self.over_lb_mean, 3),
            "tensorhub_over_lower_bound_worst": round(self.over_lb_worst, 3),
            "trace_hash": self.trace_hash,
            "events": self.events,
            # A fetcher's NIC, busy at line rate x efficiency for the lower bound's time out
            # of its whole update: its mean utilization while it updated.
            "tensorhub_rollout_nic_utilization": round(1 / self.over_lb_mean, 3),
            "schemes": {
                n: {
                    "total_stall_gpu_s": round(s.total_stall(sc), 1),
                    "rollout_mean_s": round(s.mean(), 3),
                    "rollout_worst_s": round(s.worst(), 3),
                    "trainer_stall_s": round(s.trainer_stall, 3),
                    "wan_gb": round(s.wan_bytes / 1e9, 2),
                }
                for n, s in self.schemes.items()
            },
            **self.extra,
        }


# -- placement -------------------------------------------------------------------------------


def _place(sc: Scenario, c: Cluster) -> tuple[list[str], list[str], list[str]]:
    """Trainer hosts first (rack order), then rollouts; crossdc puts the last
    ``remote_rollouts`` rollouts in the second datacenter. Returns (trainer, local, remote)."""
    dc0 = sorted(c.in_dc(0), key=_host_order)
    need = sc.trainer_hosts + sc.rollout_hosts - (sc.remote_rollouts if sc.kind == "crossdc" else 0)
    if sc.kind == "elastic":
        need += sc.joiners
    if need > len(dc0):
        raise ValueError(f"scenario {sc.name!r} needs {need} hosts in dc0, topology has {len(dc0)}")
    trainers = dc0[: sc.trainer_hosts]
    rest = dc0[sc.trainer_hosts :]
    if sc.kind != "crossdc":
        return trainers, rest[: need - sc.trainer_hosts], []
    local = rest[: sc.rollout_hosts - sc.remote_rollouts]
    dc1 = sorted(c.in_dc(1), key=_host_order)
    if sc.remote_rollouts > len(dc1):
        raise ValueError(f"scenario {sc.name!r}: dc1 has {len(dc1)} hosts")
    return trainers, local, dc1[: sc.remote_rollouts]


def _host_order(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name[1:].split("."))


# -- TensorHub ---------------------------------------------------------------------------------


@dataclass
class _SwarmRun:
    done: dict[str, float]  # fetcher -> completion time
    trainer_free: float
    wan_bytes: float
    trace_hash: str
    events: int
    crashed: list[str]
    trainer_copies: float  # the trainer hosts' egress, in model sizes
    wan_into: dict[int, float]  # datacenter -> bytes the WAN carried into it

    def scheme(self, pause: dict[str, float], sc: Scenario) -> Scheme:
        """Stalls counted from each instance's pause; the trainer's past its next step."""
        return Scheme(
            "tensorhub",
            _stalls(self.done, pause),
            max(0.0, self.trainer_free - sc.train_step_s),
            self.wan_bytes,
        )


def _tensorhub(
    sc: Scenario,
    trainers: list[str],
    fetchers: dict[str, float],
    holders: Sequence[str] = (),
    preempt: float = 0.0,
    release_at: float | None = None,
) -> _SwarmRun:
    """TensorHub's run. ``release_at``: the trainers unpublish then, or once a full copy
    is elsewhere if later, and are free when their uploads under way have drained (None:
    they serve every fetch and are free when the last byte they serve has left)."""
    e = Engine()
    net = Network(e, depth=sc.solve_depth)
    c = Cluster.build(sc.topology, host_rate=sc.node_rate)
    wan_outage(e, net, c, sc.wan_outage_s)
    s = Swarm(
        e,
        net,
        c,
        sc.size * sc.delta_fraction,  # every fetcher holds v-1: each chunk moves as a delta
        trainers,
        list(fetchers),
        sc.swarm,
        seed=sc.seed,
        holders=holders,
        origin_chunks=trainer_slices(trainers, sc.swarm.chunks),
    )
    s.start(at=fetchers)
    crashes = _preemptions(sc, holders, preempt)
    for v, at in crashes.items():
        e.at(at, functools.partial(s.crash, v))
    crashed = list(crashes)
    freed: list[float] = []
    if release_at is not None:
        release = functools.partial(unpublish, s, trainers, lambda: freed.append(e.now))
        e.at(release_at, lambda: s.when_replicated(release))
    e.run()
    _check_swarm(s, crashed)
    done = {f: s.nodes[f].finished or float("inf") for f in fetchers}
    free = freed[0] if freed else max(s.nodes[t].last_sent for t in trainers)
    wan = sum(link.carried for link in c.wan.values())
    into: dict[int, float] = {}
    for (_, dc), link in c.wan.items():
        into[dc] = into.get(dc, 0.0) + link.carried
    egress = sum(c.hosts[t].up.carried for t in trainers) / sc.size
    return _SwarmRun(done, free, wan, e.trace_hash, e.events, crashed, egress, into)


def trainer_slices(trainers: Sequence[str], chunks: int) -> dict[str, Sequence[int]]:
    """Which chunks each trainer host holds: trainer j chunks j, j + step, ... (a sharded
    trainer, every host its slice)."""
    step = max(1, min(len(trainers), chunks))
    return {t: range(j % chunks, chunks, step) for j, t in enumerate(trainers)}


def unpublish(s: Swarm, trainers: Sequence[str], then: Callable[[], None]) -> None:
    """Every trainer withdraws from ``s``; ``then`` once the last one has drained."""
    left = [len(trainers)]

    def drained() -> None:
        left[0] -= 1
        if not left[0]:
            then()

    for t in trainers:
        s.withdraw(t, drained)


def _release_at(sc: Scenario) -> float | None:
    """When TensorHub's trainers unpublish (see ``Scenario.trainer_unpublishes``)."""
    return sc.train_step_s if sc.trainer_unpublishes else None


def _preemptions(sc: Scenario, holders: Sequence[str], preempt: float) -> dict[str, float]:
    """Which holders are preempted, and when (seeded; the same for every scheme)."""
    if preempt <= 0 or not holders:
        return {}
    rng = random.Random(sc.seed * 31 + 5)
    victims = rng.sample(list(holders), max(1, int(len(holders) * preempt)))
    horizon = sc.size / sc.nic
    return {v: rng.uniform(0.1, 0.9) * horizon for v in victims}


def _check_swarm(s: Swarm, crashed: list[str]) -> None:
    """Invariants of every simulated run: every live fetcher finished holding every chunk;
    no transfer is left on the network."""
    for f in s.fetchers:
        node = s.nodes[f]
        if node.dead:
            continue
        if node.finished is None or not all(node.have):
            raise AssertionError(f"{f} did not finish (crashed holders: {crashed})")
    if s.net.flows:
        raise AssertionError(f"{len(s.net.flows)} flows left on the network")


# -- the control plane ------------------------------------------------------------------------


@dataclass
class _Control:
    commit_s: float
    heard_s: list[float]  # per node, after the commit
    leader_changes: int
    hashes: tuple[str, str]

    def heard(self, fetchers: Sequence[str]) -> dict[str, float]:
        """When each fetcher has heard of the version after its publish (committed, then
        gossiped). Node i of the gossip run stands for fetcher i."""
        n = len(self.heard_s)
        return {f: self.commit_s + self.heard_s[(i + 1) % n] for i, f in enumerate(fetchers)}

    def ready(self, fetchers: Sequence[str], at: dict[str, float]) -> dict[str, float]:
        """When each fetch may begin: its instance has paused and it has heard of the
        version."""
        return {f: max(at[f], h) for f, h in self.heard(fetchers).items()}

    def summary(self) -> dict[str, Any]:
        return {
            "commit_s": round(self.commit_s, 3),
            "gossip_worst_s": round(max(self.heard_s), 3),
            "leader_changes": self.leader_changes,
            "raft_trace": self.hashes[0],
            "gossip_trace": self.hashes[1],
        }


def _control(sc: Scenario, nodes: int) -> _Control:
    """Commit and gossip of one publish, on the real cores."""
    commit = commit_publish(sc.seed, sc.registry_voters, sc.leader_crash)
    spread = spread_version(sc.seed, nodes + 1, sc.topology.dcs)
    return _Control(
        commit.seconds,
        spread.seconds,
        commit.leader_changes,
        (commit.trace_hash, spread.trace_hash),
    )


# -- the three workloads ----------------------------------------------------------------------


def _stalls(done: dict[str, float], pause: dict[str, float]) -> dict[str, float]:
    return {r: done[r] - pause[r] for r in pause}


def _from_pulls(name: str, p: Pulls, pause: dict[str, float], sc: Scenario) -> Scheme:
    return Scheme(
        name,
        _stalls(p.done, pause),
        max(0.0, p.senders_free - sc.train_step_s),
        p.wan_bytes,
    )


def _nccl(
    sc: Scenario,
    pause: dict[str, float],
    rate: float,
    members: int,
    rebuild: float = 0.0,
    outage: tuple[float, float] | None = None,
) -> Scheme:
    barrier = max(pause.values()) + rebuild
    end = barrier + nccl_ring_s(sc, members, rate)
    if outage is not None and outage[0] < end and outage[1] > barrier:  # the ring stalls
        end += outage[1] - max(outage[0], barrier)
    return Scheme("nccl", {r: end - g for r, g in pause.items()}, max(0.0, end - sc.train_step_s))


def _standalone_tensorhub(
    sc: Scenario,
) -> tuple[Cluster, list[str], list[str], dict[str, float], _Control, _SwarmRun]:
    """The standalone workload's placement, pauses, control plane and TensorHub run."""
    c = Cluster.build(sc.topology)
    trainers, rollouts, _ = _place(sc, c)
    pause = dict(zip(rollouts, sc.generation_times(len(rollouts)), strict=True))
    ctl = _control(sc, len(trainers) + len(rollouts))
    th = _tensorhub(sc, trainers, ctl.ready(rollouts, pause), release_at=_release_at(sc))
    return c, trainers, rollouts, pause, ctl, th


def standalone(sc: Scenario) -> Outcome:
    """A trainer pool publishes; rollout instances fetch as each finishes generating."""
    c, trainers, rollouts, pause, ctl, th = _standalone_tensorhub(sc)
    schemes = {
        "tensorhub": th.scheme(pause, sc),
        "nccl": _nccl(sc, pause, sc.nic, len(trainers) + len(rollouts)),
        "ucx": _from_pulls("ucx", pull_from_trainer(c, trainers, pause, sc.size), pause, sc),
        "storage": _from_pulls(
            "storage",
            push_then_pull(Cluster.build(sc.topology), trainers, pause, sc.size, sc.storage_hosts),
            pause,
            sc,
        ),
    }
    lb = sc.size / sc.nic
    schemes["lower_bound"] = Scheme("lower_bound", {r: lb for r in rollouts}, 0.0)
    mine = schemes["tensorhub"]
    versus = _standalone_versus(sc, c, trainers, rollouts, pause, ctl, schemes)
    return Outcome(
        sc,
        schemes,
        "total GPU stall (trainer + rollout)",
        "nccl",
        mine.mean() / lb,
        mine.worst() / lb,
        th.trace_hash,
        th.events,
        {
            "ratios": {
                k: round(s.total_stall(sc) / mine.total_stall(sc), 2)
                for k, s in schemes.items()
                if k != "tensorhub"
            },
            "control": ctl.summary(),
            "trainer_egress_copies": round(th.trainer_copies, 2),
            **_versus_summary(versus),
            "tail_over_copy": round(_tail(pause) / lb, 2),
        },
    )


def standalone_swarm_only(sc: Scenario) -> dict[str, float]:
    """The standalone workload's TensorHub run alone (its control plane and swarm, no
    baseline): what the simulator's scale is measured on (``bench/sim_scale.py``)."""
    _c, _t, _r, pause, _ctl, th = _standalone_tensorhub(sc)
    mine = th.scheme(pause, sc)
    lb = sc.size / sc.nic
    return {
        "events": th.events,
        "mean_over_bound": mine.mean() / lb,
        "worst_over_bound": mine.worst() / lb,
    }


def _versus(name: str, base: float, mine: float) -> Versus:
    return Versus(name, base / mine)


def _versus_summary(versus: list[Versus]) -> dict[str, Any]:
    """The strong baselines' ratios for a summary (empty when the scenario has none)."""
    if not versus:
        return {}
    return {
        "versus": {v.name: round(v.ratio, 3) for v in versus},
        "strongest": strongest(versus).name,
    }


def _tail(pause: dict[str, float]) -> float:
    """The generation tail: the slowest instance's pause past the median's."""
    times = sorted(pause.values())
    return times[-1] - times[len(times) // 2]


def _standalone_versus(
    sc: Scenario,
    c: Cluster,
    trainers: list[str],
    rollouts: list[str],
    pause: dict[str, float],
    ctl: _Control,
    schemes: dict[str, Scheme],
) -> list[Versus]:
    """Total GPU stall against the strongest deployments of sim/strong.py."""
    if not sc.strong_baselines:
        return []
    mine, ucx = schemes["tensorhub"], schemes["ucx"]
    snap = snapshot_trainer_stall(sc)
    hosts = max(sc.storage_hosts, sc.trainer_hosts)
    store = push_then_pull(Cluster.build(sc.topology), trainers, pause, sc.size, hosts)
    # A static ring started at the publish has filled every staging buffer then.
    ring_end = nccl_ring_s(sc, len(trainers) + len(rollouts), sc.nic)
    staged = _tensorhub(sc, trainers, ctl.ready(rollouts, dict.fromkeys(rollouts, 0.0)))

    def total(s: Scheme) -> float:
        return s.total_stall(sc)

    return [
        _versus(f"storage, {hosts} NICs", total(_from_pulls("storage", store, pause, sc)),
                total(mine)),
        _versus("ucx + snapshot", total(replace(ucx, trainer_stall=snap)),
                total(replace(mine, trainer_stall=snap))),
        _versus("nccl staged",
                total(Scheme("nccl-staged", staged_stalls(dict.fromkeys(rollouts, ring_end),
                                                          pause, sc), snap)),
                total(Scheme("tensorhub-staged", staged_stalls(staged.done, pause, sc), snap))),
    ]  # fmt: skip


def elastic(sc: Scenario) -> Outcome:
    """Spot joiners arrive at once while ``rollout_hosts`` already hold the version; some
    holders may be preempted mid-transfer."""
    c = Cluster.build(sc.topology)
    trainers, hosts, _ = _place(sc, c)
    holders, joiners = hosts[: sc.rollout_hosts], hosts[sc.rollout_hosts :]
    arrive = dict.fromkeys(joiners, 0.0)
    # The version was committed and gossiped long ago; a joiner gets the holder map in its
    # first state exchange with a seed (one round trip), which is not modelled.
    th = _tensorhub(sc, trainers, arrive, holders, sc.preempt)
    ucx = pull_from_trainer(c, trainers, arrive, sc.size)
    schemes = {
        "tensorhub": Scheme("tensorhub", _stalls(th.done, arrive), 0.0, th.wan_bytes),
        "ucx": Scheme("ucx", _stalls(ucx.done, arrive), 0.0, ucx.wan_bytes),
        "nccl": _nccl(
            sc, arrive, sc.nic, len(trainers) + len(holders) + len(joiners), sc.nccl_rebuild_s
        ),
    }
    lb = sc.size / sc.nic
    schemes["lower_bound"] = Scheme("lower_bound", dict.fromkeys(joiners, lb), 0.0)
    mine = schemes["tensorhub"]
    versus: list[Versus] = []
    if sc.strong_baselines:
        crashes = _preemptions(sc, holders, sc.preempt)
        chunk = sc.nccl_chunk_mb * 1e6
        p2p = rack_chains(Cluster.build(sc.topology), holders, arrive, sc.size, crashes, chunk)
        members = len(trainers) + len(holders) + len(joiners)
        versus = [
            _versus("rack p2p chains",
                    Scheme("p2p", _stalls(p2p, arrive)).mean(), mine.mean()),
            _versus("nccl, no rebuild", _nccl(sc, arrive, sc.nic, members).mean(),
                    mine.mean()),
        ]  # fmt: skip
    return Outcome(
        sc,
        schemes,
        "mean weight-update latency of joiners",
        "ucx",
        mine.mean() / lb,
        mine.worst() / lb,
        th.trace_hash,
        th.events,
        {
            "preempted_holders": len(th.crashed),
            "trainer_egress_copies": round(th.trainer_copies, 2),
            **_versus_summary(versus),
            "tail_over_copy": 0.0,
        },
        metric="mean",
    )


def crossdc(sc: Scenario) -> Outcome:
    """Rollouts in a second datacenter behind the WAN; the headline counts their stall."""
    c = Cluster.build(sc.topology)
    trainers, local, remote = _place(sc, c)
    rollouts = local + remote
    pause = dict(zip(rollouts, sc.generation_times(len(rollouts)), strict=True))
    fetchers = dict(pause)
    spare = [h for h in sorted(c.in_dc(1), key=_host_order) if h not in set(remote)]
    if (sc.remote_seed or sc.strong_baselines) and not spare:
        raise ValueError(f"scenario {sc.name!r}: no spare dc1 host for the remote seed")
    if sc.remote_seed:  # a spare dc1 host (CPU memory) starts pulling at publish
        fetchers[spare[0]] = 0.0
    ctl = _control(sc, len(trainers) + len(fetchers))
    th = _tensorhub(sc, trainers, ctl.ready(list(fetchers), fetchers), release_at=_release_at(sc))
    naive = pull_from_trainer(c, trainers, pause, sc.size, sc.wan_outage_s)
    wan = sc.topology.wan_gbytes * 1e9
    schemes = {
        "tensorhub": th.scheme(pause, sc),
        "naive": _from_pulls("naive", naive, pause, sc),
        "nccl": _nccl(
            sc, pause, min(sc.nic, wan), len(trainers) + len(rollouts), outage=sc.wan_outage_s
        ),
    }
    # Bound: a remote instance needs its whole copy after pausing, and the first copy
    # cannot cross the WAN faster than size / wan after the publish.
    crossing = sc.size / wan
    cut = sc.wan_outage_s
    if cut is not None and cut[0] < crossing:  # nothing crosses while the WAN is cut
        crossing += cut[1] - max(cut[0], 0.0)
    lb = {r: max(sc.size / sc.nic, crossing - pause[r] if r in remote else 0) for r in rollouts}
    schemes["lower_bound"] = Scheme("lower_bound", lb, 0.0)
    mine = schemes["tensorhub"]
    remote_lb = [lb[r] for r in remote]
    remote_mine = [mine.rollout_stall[r] for r in remote]
    versus: list[Versus] = []
    if sc.strong_baselines:
        stalls, free, wan_bytes = relay_then_ring(sc, trainers, spare[0], remote, pause)
        relay = Scheme("relay+ring", stalls, max(0.0, free - sc.train_step_s), wan_bytes)
        versus = [
            _versus("wan relay + ring", relay.total_stall(sc, remote),
                    mine.total_stall(sc, remote)),
        ]  # fmt: skip
    return Outcome(
        sc,
        schemes,
        "remote rollouts' GPU stall",
        "naive",
        sum(remote_mine) / sum(remote_lb),
        max(m / b for m, b in zip(remote_mine, remote_lb, strict=True)),
        th.trace_hash,
        th.events,
        {
            "wan_copies": round(th.wan_bytes / sc.size, 2),
            # Into the trainers' datacenter too where they let go (their memory is the next
            # step's) before any rollout there began: the remote seed's was the only copy.
            "wan_copies_into": {
                f"dc{d}": round(b / sc.size, 2) for d, b in sorted(th.wan_into.items())
            },
            "trainer_egress_copies": round(th.trainer_copies, 2),
            "control": ctl.summary(),
            **_versus_summary(versus),
            "tail_over_copy": round(_tail({r: pause[r] for r in remote}) / (sc.size / sc.nic), 2),
        },
        focus=tuple(remote),
    )


RUNNERS = {"standalone": standalone, "elastic": elastic, "crossdc": crossdc}


def run(sc: Scenario) -> Outcome:
    return RUNNERS[sc.kind](sc)
