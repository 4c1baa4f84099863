"""A scenario: the cluster, the RL workload and the model, as one YAML file.

Every number that is an assumption (the paper does not give it) is a field here with a
default, so ``python -m sim sweep`` can move it and ``docs/results.md`` can name it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import yaml

from tensorhub.core.swarm import PlannerConfig

from .swarm import SwarmConfig
from .topology import TopologySpec

KINDS = ("standalone", "elastic", "crossdc")
DATAPLANES = ("tcp", "gpudirect")
TCP_NODE_GBYTES = 3.05
"""What one node moves over TCP, GB/s each way: the median of six ``bench/p2p.py --size
1GiB`` runs on a 16-core H100 host (docs/results/h100/p2p-tcp-cpu-1GiB-blake3-{a..f}.json:
2.68-3.20 GB/s, 0.91-0.99x a raw socket there; to CUDA memory through pinned host buffers,
4 GiB, 3.11 GB/s). One connection on loopback: a raw socket there moves only 3.2 GB/s, so
this may understate what several connections on a 200-400 Gbit/s NIC would carry; the
``standalone: node data plane`` sweep moves it."""


@dataclass(frozen=True)
class Scenario:
    """One experiment. Hosts are 8-GPU machines with one NIC rate each (a TP-8 rollout
    instance is one host; a trainer host holds its slice of the weights)."""

    name: str
    kind: str  # standalone | elastic | crossdc
    model_gb: float = 50.0
    gpus_per_host: int = 8
    trainer_hosts: int = 32  # 256 trainer GPUs; each holds 1/trainer_hosts of the weights
    rollout_hosts: int = 96  # 768 rollout GPUs in TP-8 instances
    # Rollout generation. An instance generates ``gen_requests`` responses per step and
    # pauses when its longest is done; each response's time is log-normal with
    # ``gen_sigma``, scaled so the median instance pauses at ``gen_median_s``. 1: the
    # instance's own time is the log-normal draw. The shipped scenarios calibrate sigma and
    # the request count to Seer's published rollouts (``scenarios/standalone.yaml``).
    gen_median_s: float = 30.0
    gen_sigma: float = 0.3
    gen_requests: int = 1
    train_step_s: float = 30.0  # trainer compute before its optimizer step mutates weights
    # TensorHub's trainer as the README runs it: at its next optimizer step, once a full
    # copy is elsewhere, it unpublishes (uploads under way drain; later fetches go to the
    # rollouts). False: it serves every fetch, stalled until its last byte has left.
    trainer_unpublishes: bool = True
    # Elastic: rollout_hosts hold the version; joiners arrive at once and fetch it.
    joiners: int = 64
    preempt: float = 0.0  # fraction of holders preempted while joiners fetch
    # Cross-DC: this many of the rollout hosts sit in the second datacenter.
    remote_rollouts: int = 32
    # ...and at publish one spare host there pulls a seed copy into CPU memory (the paper's
    # "optional CPU copy"), so the WAN crossing overlaps the remote rollouts' generation.
    remote_seed: bool = True
    # Control plane (real Raft and gossip cores): the registry's voters, and faults.
    registry_voters: int = 3
    leader_crash: bool = False  # the registry's leader dies right after the publish
    wan_outage_s: tuple[float, float] | None = None  # crossdc: the WAN is cut in [a, b)
    # Baselines.
    storage_hosts: int = 8  # push-then-pull store: hosts with the same NIC rate
    nccl_chunk_mb: float = 4.0  # ring pipeline granularity
    nccl_rebuild_s: float = 0.0  # group re-creation when membership changed (elastic)
    # Device <-> pinned host memory per GPU (PCIe Gen4 x16 ~25 GB/s, Gen5 ~50): a trainer's
    # host snapshot and a staged rollout's copy into its GPUs (sim/strong.py).
    pcie_gbytes: float = 25.0
    # Also run the strongest honest baselines (sim/strong.py) beside the paper's kinds.
    strong_baselines: bool = True
    # TensorHub's data plane. "tcp": as built, every host's node moves at most
    # ``tcp_node_gbytes`` each way (its per-chunk CPU, BLAKE3 and the staging through pinned
    # host memory are inside that measured rate). "gpudirect": a hypothetical RDMA data plane
    # at the NIC's effective rate, what the paper measured (22 GB/s); not built. Baselines
    # (NCCL, UCX, a store) run at the NIC's rate in both: they exist on RDMA today.
    dataplane: str = "tcp"
    tcp_node_gbytes: float = TCP_NODE_GBYTES
    # Deltas (issue #21): every rollout holds v-1 and each chunk of v moves as a delta of
    # this fraction of its size (bench/deltas.py measured 0.021-0.024 at lr 1e-6 and
    # 0.085-0.097 at 1e-5 with XOR+zstd); 1.0: full versions. TensorHub's transfers only;
    # decoding's CPU is not modelled.
    delta_fraction: float = 1.0
    topology: TopologySpec = field(default_factory=TopologySpec)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)
    # TensorHub's network re-solve (sim/network.py, ``Network.depth``): after a flow starts
    # or ends, the flows within this many links of it get max-min fair rates again, and
    # flows further out keep theirs until a change of their own. None: every flow
    # connected to it, exact but O(network) per change (a 2,048-GPU broadcast re-solved 230
    # flows per change on average). 3 (39 flows per change at 10,240 GPUs, against 905
    # exact): at 10,240 GPUs the mean over the bound is within 0.4 % of exact and the
    # worst within 0.8 % (4: 0.6 %, 3.6 %); at 1,024 GPUs the total stall within 0.2 %,
    # the worst rollout 3.1 % late (4 is exact there; docs/results.md). The baselines'
    # runs, with few flows, are always exact.
    solve_depth: int | None = 3
    seed: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"scenario {self.name!r}: kind must be one of {KINDS}")
        if self.trainer_hosts < 1 or self.rollout_hosts < 1:
            raise ValueError(f"scenario {self.name!r}: needs trainer and rollout hosts")
        if not 0 < self.delta_fraction <= 1:
            raise ValueError(f"scenario {self.name!r}: delta_fraction must be in (0, 1]")
        if self.gen_requests < 1:
            raise ValueError(f"scenario {self.name!r}: gen_requests must be >= 1")
        if self.solve_depth is not None and self.solve_depth < 1:
            raise ValueError(f"scenario {self.name!r}: solve_depth must be >= 1 (or None)")
        if self.dataplane not in DATAPLANES:
            raise ValueError(f"scenario {self.name!r}: dataplane must be one of {DATAPLANES}")
        if self.kind == "crossdc" and self.topology.dcs < 2:
            raise ValueError(f"scenario {self.name!r}: crossdc needs topology.dcs >= 2")

    @property
    def size(self) -> float:
        return self.model_gb * 1e9

    @property
    def nic(self) -> float:
        """Effective NIC rate, bytes/s."""
        return self.topology.nic_gbytes * 1e9 * self.topology.efficiency

    @property
    def node_rate(self) -> float | None:
        """The cap TensorHub's data plane puts on each host, bytes/s (None: the NIC's)."""
        return self.tcp_node_gbytes * 1e9 if self.dataplane == "tcp" else None

    def generation_times(self, n: int, step: int = 0) -> list[float]:
        """When each of ``n`` rollout instances finishes generating (seeded): the longest of
        its ``gen_requests`` responses. ``step``: the how-many-th step of a run of several
        (``sim/steady.py``), each with draws of its own; step 0 is the one-step run's.

        Why the longest of many rather than one draw per instance: a synchronous step
        hands each instance a batch, and the instance pauses for new weights when its last
        response is done. The published spread is of responses (Seer: the last tenth of
        them takes up to half the rollout), and the maximum of a batch spreads far less
        than one response does (sigma 0.28 per response is about 0.12 per instance at 100
        responses each), so putting a response's spread on whole instances overstates
        the tail a barrier waits on."""
        rng = random.Random(self.seed * 7919 + 17 + step * 104_729)
        r = self.gen_requests
        # The median of the longest of r draws is the (1/2)^(1/r) quantile of one draw;
        # dividing it out keeps gen_median_s the median instance's time for every r.
        q = NormalDist().inv_cdf(0.5 ** (1 / r)) if r > 1 else 0.0
        mu = math.log(self.gen_median_s) - self.gen_sigma * q
        draw = rng.lognormvariate
        if r == 1:
            return [draw(mu, self.gen_sigma) for _ in range(n)]
        return [max(draw(mu, self.gen_sigma) for _ in range(r)) for _ in range(n)]

    def replace(self, **changes: Any) -> Scenario:
        """A copy with fields changed; ``topology.x``, ``swarm.x`` and ``swarm.planner.x``
        reach the nested ones."""
        top: dict[str, Any] = {}
        sw: dict[str, Any] = {}
        plan: dict[str, Any] = {}
        flat: dict[str, Any] = {}
        for k, v in changes.items():
            if k.startswith("swarm.planner."):
                plan[k.split(".", 2)[2]] = v
            elif k.startswith("topology."):
                top[k.split(".", 1)[1]] = v
            elif k.startswith("swarm."):
                sw[k.split(".", 1)[1]] = v
            else:
                flat[k] = v
        if top:
            flat["topology"] = dataclasses.replace(self.topology, **top)
        if plan:
            sw["planner"] = dataclasses.replace(self.swarm.planner, **plan)
        if sw:
            flat["swarm"] = dataclasses.replace(self.swarm, **sw)
        return dataclasses.replace(self, **flat)


def load(path: str | Path) -> Scenario:
    """A scenario from YAML: top-level fields, with ``topology:`` and ``swarm:`` maps."""
    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a scenario is a YAML mapping")
    return from_dict(raw, default_name=Path(path).stem)


def from_dict(raw: dict[str, Any], default_name: str = "scenario") -> Scenario:
    raw = dict(raw)
    known = {f.name for f in dataclasses.fields(Scenario)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown scenario fields: {sorted(unknown)}")
    topo = raw.pop("topology", None) or {}
    sw = raw.pop("swarm", None) or {}
    bad = set(topo) - {f.name for f in dataclasses.fields(TopologySpec)}
    if bad:
        raise ValueError(f"unknown topology fields: {sorted(bad)}")
    bad = set(sw) - {f.name for f in dataclasses.fields(SwarmConfig)}
    if bad:
        raise ValueError(f"unknown swarm fields: {sorted(bad)}")
    if "planner" in sw:  # a map of PlannerConfig fields over the simulator's defaults
        plan = sw["planner"]
        if not isinstance(plan, dict):
            raise ValueError("swarm.planner is a map of PlannerConfig fields")
        fields = {f.name for f in dataclasses.fields(PlannerConfig)}
        if set(plan) - fields:
            raise ValueError(f"unknown swarm.planner fields: {sorted(set(plan) - fields)}")
        sw["planner"] = dataclasses.replace(SwarmConfig().planner, **plan)
    raw.setdefault("name", default_name)
    if raw.get("wan_outage_s") is not None:
        a, b = raw["wan_outage_s"]
        raw["wan_outage_s"] = (float(a), float(b))
    return Scenario(topology=TopologySpec(**topo), swarm=SwarmConfig(**sw), **raw)
