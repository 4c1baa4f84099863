"""A launch topology: who runs where, the WAN between datacenters, the run and its chaos.

Read from YAML (``tensorhub launch TOPOLOGY.yaml``) or built in Python. Every mistake is
refused up front with the path of the offending key, before a process starts::

    model: {dim: 384, layers: 6, vocab: 4096, context: 32}   # TinyLM, trained for real
    run: {versions: 3, train_steps: 4}     # also chunk_mb, timeout_s, copies_before_reuse
    nodes:
      - {name: trainer, at: dc1/rack1, role: trainer}
      - {name: rollout-a1, at: dc1/rack1, voter: true}
      - {name: rollout-b1, at: dc2/rack1, voter: true}
      ...
    wan:                       # off unless given: loopback is not a WAN
      - {between: [dc1, dc2], bandwidth: 2Gbit, rtt_ms: 10}
    chaos: {kill_rollouts: 1, kill_leader: true, seed: 7}
    http: true                 # /status, /metrics and a dashboard on every node
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..demo.model import TinyLMConfig


class TopologyError(ValueError):
    """The topology is invalid; the message names the key."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    at: str  # dc/rack
    role: str = "rollout"  # or "trainer"
    voter: bool = False

    @property
    def dc(self) -> str:
        return self.at.split("/")[0]

    @property
    def locality(self) -> str:
        return f"{self.at}/{self.name}"


@dataclass(frozen=True)
class WanLink:
    a: str
    b: str
    bandwidth: float  # bytes per second, the whole link
    rtt: float  # seconds


@dataclass(frozen=True)
class Chaos:
    kill_rollouts: int = 0  # rollouts killed with SIGKILL during the run, at random
    kill_leader: bool = False  # kill the Raft leader once, mid-run (never the trainer)
    seed: int = 0


@dataclass(frozen=True)
class Topology:
    nodes: tuple[NodeSpec, ...]
    model: TinyLMConfig = field(default_factory=TinyLMConfig)
    versions: int = 3
    train_steps: int = 4
    chunk_bytes: int = 1 << 20
    wan: tuple[WanLink, ...] = ()
    chaos: Chaos = field(default_factory=Chaos)
    http: bool = True
    timeout: float = 300.0
    copies: int | None = None  # full copies before the trainer reuses its memory

    @property
    def copies_before_reuse(self) -> int:
        """As configured; by default one, plus one per chaos kill, so chaos cannot destroy
        a version's every copy (f failures need f + 1 copies)."""
        if self.copies is not None:
            return self.copies
        kills = self.chaos.kill_rollouts + int(self.chaos.kill_leader)
        return max(1, min(1 + kills, len(self.rollouts) - kills))

    @property
    def trainer(self) -> NodeSpec:
        return next(n for n in self.nodes if n.role == "trainer")

    @property
    def rollouts(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.role == "rollout"]

    @property
    def voters(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.voter]

    @property
    def datacenters(self) -> list[str]:
        return sorted({n.dc for n in self.nodes})

    def links_from(self, dc: str) -> dict[str, tuple[float, float]]:
        """Remote DC → (bandwidth, rtt) of the link from ``dc``."""
        out = {}
        for link in self.wan:
            if dc in (link.a, link.b):
                out[link.b if dc == link.a else link.a] = (link.bandwidth, link.rtt)
        return out

    def with_(self, **changes: Any) -> Topology:
        from dataclasses import replace

        return replace(self, **changes)


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|b|bps|b/s|bit/s)?\s*$", re.I)


def parse_bandwidth(text: str | float, where: str) -> float:
    """'2Gbit', '1.5Gbit/s', '100MB/s', '125MB' or a number of bytes/s → bytes per second."""
    if isinstance(text, int | float):
        return float(text)
    assert isinstance(text, str)
    m = _RATE.match(str(text))
    if not m:
        raise TopologyError(f"{where}: cannot parse bandwidth {text!r} (try 2Gbit or 200MB/s)")
    value = float(m.group(1)) * 1000.0 ** " kmgt".index(m.group(2).lower() or " ")
    unit = (m.group(3) or "b").lower()
    return value / 8 if unit.startswith("bit") or unit == "bps" else value


def _check_keys(d: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise TopologyError(f"{where}: expected a mapping, got {type(d).__name__}")
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return d


def from_dict(data: Any) -> Topology:
    d = _check_keys(data, {"model", "run", "nodes", "wan", "chaos", "http"}, "topology")
    model = TinyLMConfig(
        **_check_keys(d.get("model", {}), {"dim", "layers", "vocab", "heads", "context"}, "model")
    )
    run = _check_keys(
        d.get("run", {}),
        {"versions", "train_steps", "chunk_mb", "timeout_s", "copies_before_reuse"},
        "run",
    )
    nodes = []
    for i, raw in enumerate(d.get("nodes") or []):
        n = _check_keys(raw, {"name", "at", "role", "voter"}, f"nodes[{i}]")
        if "name" not in n or "at" not in n:
            raise TopologyError(f"nodes[{i}]: needs a name and an 'at: dc/rack'")
        at = str(n["at"])
        if len(at.split("/")) != 2 or not all(at.split("/")):
            raise TopologyError(f"nodes[{i}] ({n['name']}): 'at' must be dc/rack, got {at!r}")
        role = n.get("role", "rollout")
        if role not in ("trainer", "rollout"):
            raise TopologyError(f"nodes[{i}] ({n['name']}): role must be trainer or rollout")
        nodes.append(NodeSpec(str(n["name"]), at, role, bool(n.get("voter", False))))
    wan = []
    for i, raw in enumerate(d.get("wan") or []):
        w = _check_keys(raw, {"between", "bandwidth", "rtt_ms"}, f"wan[{i}]")
        pair = w.get("between")
        if not isinstance(pair, list) or len(pair) != 2:
            raise TopologyError(f"wan[{i}]: 'between' must name two datacenters")
        bw = parse_bandwidth(w.get("bandwidth", "10Gbit"), f"wan[{i}].bandwidth")
        wan.append(WanLink(str(pair[0]), str(pair[1]), bw, float(w.get("rtt_ms", 0)) / 1e3))
    chaos = Chaos(
        **_check_keys(d.get("chaos", {}), {"kill_rollouts", "kill_leader", "seed"}, "chaos")
    )
    topo = Topology(
        nodes=tuple(nodes),
        model=model,
        versions=int(run.get("versions", 3)),
        train_steps=int(run.get("train_steps", 4)),
        chunk_bytes=int(float(run.get("chunk_mb", 1)) * (1 << 20)),
        wan=tuple(wan),
        chaos=chaos,
        http=bool(d.get("http", True)),
        timeout=float(run.get("timeout_s", 300)),
        copies=int(run["copies_before_reuse"]) if "copies_before_reuse" in run else None,
    )
    validate(topo)
    return topo


def validate(t: Topology) -> None:
    names = [n.name for n in t.nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TopologyError(f"nodes: duplicate names {dup}")
    if sum(n.role == "trainer" for n in t.nodes) != 1:
        raise TopologyError("nodes: exactly one node must have role: trainer")
    if not t.rollouts:
        raise TopologyError("nodes: at least one rollout is needed")
    if len(t.voters) not in (1, 3, 5):
        raise TopologyError(f"nodes: 1, 3 or 5 voters (voter: true), not {len(t.voters)}")
    dcs = set(t.datacenters)
    for i, link in enumerate(t.wan):
        for dc in (link.a, link.b):
            if dc not in dcs:
                raise TopologyError(f"wan[{i}]: no node is in datacenter {dc!r}")
        if link.a == link.b:
            raise TopologyError(f"wan[{i}]: a link joins two different datacenters")
        if link.bandwidth <= 0:
            raise TopologyError(f"wan[{i}]: bandwidth must be positive")
    if t.versions < 1 or t.train_steps < 1:
        raise TopologyError("run: versions and train_steps must be at least 1")
    if t.chaos.kill_rollouts >= len(t.rollouts):
        raise TopologyError("chaos: kill_rollouts must leave at least one rollout alive")
    if not 1 <= t.copies_before_reuse <= len(t.rollouts):
        raise TopologyError("run: copies_before_reuse must be between 1 and the rollouts")
    if t.chaos.kill_leader and sum(n.voter and n.role == "rollout" for n in t.nodes) < 2:
        raise TopologyError("chaos: kill_leader needs voters besides the trainer")


def load(path: str | Path) -> Topology:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise TopologyError(f"{path}: not valid YAML: {e}") from e
    return from_dict(data)


DEFAULT = """
# The embedded default (make demo): 2 datacenters x 2 racks, a trainer and 6 rollouts.
model: {dim: 384, layers: 6, vocab: 4096, heads: 6, context: 32}
run: {versions: 3, train_steps: 3, chunk_mb: 1}
nodes:
  - {name: trainer,    at: dc1/rack1, role: trainer}
  - {name: rollout-a1, at: dc1/rack1, voter: true}
  - {name: rollout-a2, at: dc1/rack2, voter: true}
  - {name: rollout-a3, at: dc1/rack2}
  - {name: rollout-b1, at: dc2/rack1, voter: true}
  - {name: rollout-b2, at: dc2/rack1}
  - {name: rollout-b3, at: dc2/rack2}
wan:
  - {between: [dc1, dc2], bandwidth: 2Gbit, rtt_ms: 10}
http: true
"""


def default() -> Topology:
    return from_dict(yaml.safe_load(DEFAULT))
