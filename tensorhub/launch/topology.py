"""A launch topology: who runs where, the WAN between datacenters, the run and its chaos.

Read from YAML (``tensorhub launch TOPOLOGY.yaml``) or built in Python. Every mistake is
refused up front with the path of the offending key, before a process starts::

    model: {dim: 384, layers: 6, vocab: 4096, context: 32}   # TinyLM, trained for real
    run: {versions: 3, train_steps: 4}     # also chunk_mb, timeout_s, copies_before_reuse,
                                           # lr, deltas (publish each version as a delta too),
                                           # dataplane (a preset: node, swarm, relay, ...),
                                           # step_s (each version trains at least this long)
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
from typing import Annotated, Any, Literal

import msgspec
import yaml

from ..core.swarm.presets import preset
from ..demo.model import TinyLMConfig


class TopologyError(ValueError):
    """The topology is invalid. ``key`` is the path of the offending key ("run.versions",
    "nodes[2].voter"); :func:`load` prefixes the file and line it is on."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


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
    lr: float = 3e-3  # the trainer's AdamW learning rate (RL fine-tuning runs 1e-6..1e-5)
    deltas: bool = False  # publish each version with a delta from the one before
    dataplane: str = "node"  # every node's data-plane preset (core/swarm/presets.py)
    step_s: float = 0.0
    """The least seconds each version's training takes (the trainer sleeps the rest). An RL
    step (generation, then the update) takes seconds to minutes; TinyLM's takes
    milliseconds, so without this versions come faster than a fault is ridden out, and a
    rollout the fault delayed finds each next version already overwritten too."""

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


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|b|bps|b/s|bit/s)?\s*$", re.I)


def parse_bandwidth(text: str | float, where: str) -> float:
    """'2Gbit', '1.5Gbit/s', '100MB/s', '125MB' or a number of bytes/s → bytes per second."""
    if isinstance(text, int | float):
        return float(text)
    m = _RATE.match(str(text))
    if not m:
        raise TopologyError(f"cannot parse bandwidth {text!r} (try 2Gbit or 200MB/s)", where)
    value = float(m.group(1)) * 1000.0 ** " kmgt".index(m.group(2).lower() or " ")
    unit = (m.group(3) or "b").lower()
    rate = value / 8 if unit.startswith("bit") or unit == "bps" else value
    if rate <= 0:
        raise TopologyError(f"bandwidth {text!r} must be positive", where)
    return rate


class _Doc(msgspec.Struct, forbid_unknown_fields=True):
    """The YAML document's schema: strict types (``voter: "false"`` is refused, not made
    truthy), ranges, no unknown keys. msgspec (already a dependency, for the wire) checks it
    and names the path of the first mistake."""


Positive = Annotated[int, msgspec.Meta(gt=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]


class _ModelDoc(_Doc):
    dim: Positive = 256
    layers: Positive = 4
    vocab: Positive = 2048
    heads: Positive = 4
    context: Positive = 64


class _RunDoc(_Doc):
    versions: Positive = 3
    train_steps: Positive = 4
    chunk_mb: PositiveFloat = 1.0
    timeout_s: PositiveFloat = 300.0
    copies_before_reuse: Positive | None = None
    lr: PositiveFloat = 3e-3
    deltas: bool = False
    dataplane: str = "node"
    step_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class _NodeDoc(_Doc):
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    at: Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$")]
    role: Literal["trainer", "rollout"] = "rollout"
    voter: bool = False


class _WanDoc(_Doc):
    between: Annotated[list[str], msgspec.Meta(min_length=2, max_length=2)]
    bandwidth: str | PositiveFloat = "10Gbit"
    rtt_ms: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class _ChaosDoc(_Doc):
    kill_rollouts: Annotated[int, msgspec.Meta(ge=0)] = 0
    kill_leader: bool = False
    seed: int = 0


class _TopologyDoc(_Doc):
    nodes: list[_NodeDoc]
    model: _ModelDoc = msgspec.field(default_factory=_ModelDoc)
    run: _RunDoc = msgspec.field(default_factory=_RunDoc)
    wan: list[_WanDoc] = msgspec.field(default_factory=list)
    chaos: _ChaosDoc = msgspec.field(default_factory=_ChaosDoc)
    http: bool = True


_AT = re.compile(r"^(.*?) - at `\$(.*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$")


def _schema_error(e: msgspec.ValidationError) -> TopologyError:
    """msgspec's "Expected `int`, got `str` - at `$.run.versions`" as a keyed error."""
    text = str(e)
    m = _AT.match(text)
    message, path = (m.group(1), m.group(2).lstrip(".")) if m else (text, "")
    u = _UNKNOWN.match(message)
    if u:
        key = f"{path}.{u.group(1)}" if path else u.group(1)
        return TopologyError("unknown key", key)
    message = message.replace("`", "")
    if "matching regex" in message:
        message = _PATTERN_HINTS.get(path.rsplit(".", 1)[-1], message)
    return TopologyError(message[:1].lower() + message[1:], path or "topology")


_PATTERN_HINTS = {
    "at": "must be dc/rack (e.g. dc1/rack1)",
    "name": "must be letters, digits, '.', '_' or '-' (it names a process and a directory)",
}


def from_dict(data: Any) -> Topology:
    try:
        doc = msgspec.convert(data, _TopologyDoc, strict=True)
    except msgspec.ValidationError as e:
        raise _schema_error(e) from None
    m = doc.model
    if m.dim % m.heads:
        raise TopologyError(f"dim {m.dim} is not a multiple of heads {m.heads}", "model.dim")
    wan = [
        WanLink(
            w.between[0],
            w.between[1],
            parse_bandwidth(w.bandwidth, f"wan[{i}].bandwidth"),
            w.rtt_ms / 1e3,
        )
        for i, w in enumerate(doc.wan)
    ]
    topo = Topology(
        nodes=tuple(NodeSpec(n.name, n.at, n.role, n.voter) for n in doc.nodes),
        model=TinyLMConfig(m.vocab, m.dim, m.layers, m.heads, m.context),
        versions=doc.run.versions,
        train_steps=doc.run.train_steps,
        chunk_bytes=max(1, int(doc.run.chunk_mb * (1 << 20))),
        wan=tuple(wan),
        chaos=Chaos(doc.chaos.kill_rollouts, doc.chaos.kill_leader, doc.chaos.seed),
        http=doc.http,
        timeout=doc.run.timeout_s,
        copies=doc.run.copies_before_reuse,
        lr=doc.run.lr,
        deltas=doc.run.deltas,
        dataplane=doc.run.dataplane,
        step_s=doc.run.step_s,
    )
    validate(topo)
    return topo


def validate(t: Topology) -> None:
    """The rules that span keys (the schema has checked each key on its own)."""
    names = [n.name for n in t.nodes]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise TopologyError(f"duplicate node name {name!r}", f"nodes[{i}].name")
    if sum(n.role == "trainer" for n in t.nodes) != 1:
        raise TopologyError("exactly one node must have role: trainer", "nodes")
    if not t.rollouts:
        raise TopologyError("at least one rollout is needed", "nodes")
    if len(t.voters) not in (1, 3, 5):
        raise TopologyError(f"1, 3 or 5 voters (voter: true), not {len(t.voters)}", "nodes")
    dcs = set(t.datacenters)
    for i, link in enumerate(t.wan):
        for dc in (link.a, link.b):
            if dc not in dcs:
                raise TopologyError(f"no node is in datacenter {dc!r}", f"wan[{i}].between")
        if link.a == link.b:
            raise TopologyError("a link joins two different datacenters", f"wan[{i}].between")
        if link.bandwidth <= 0:
            raise TopologyError("bandwidth must be positive", f"wan[{i}].bandwidth")
    if t.versions < 1 or t.train_steps < 1:
        raise TopologyError("versions and train_steps must be at least 1", "run")
    if t.timeout <= 0:
        raise TopologyError("timeout_s must be positive", "run.timeout_s")
    try:
        preset(t.dataplane)
    except ValueError as e:
        raise TopologyError(str(e), "run.dataplane") from None
    if t.chaos.kill_rollouts >= len(t.rollouts):
        raise TopologyError(
            "kill_rollouts must leave at least one rollout alive", "chaos.kill_rollouts"
        )
    if not 1 <= t.copies_before_reuse <= len(t.rollouts):
        raise TopologyError(
            "copies_before_reuse must be between 1 and the rollouts", "run.copies_before_reuse"
        )
    if t.chaos.kill_leader and sum(n.voter and n.role == "rollout" for n in t.nodes) < 2:
        raise TopologyError("kill_leader needs voters besides the trainer", "chaos.kill_leader")


def load(path: str | Path) -> Topology:
    """Read and validate a topology file; every error names the file, the line and the key."""
    return from_text(Path(path).read_text(), str(path))


def from_text(text: str, filename: str = "<topology>") -> Topology:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{filename}:{mark.line + 1}" if mark is not None else filename
        problem = getattr(e, "problem", None) or str(e)
        raise TopologyError(f"{where}: not valid YAML: {problem}") from None
    try:
        return from_dict(data if data is not None else {})
    except TopologyError as e:
        line = _line_of(root, e.key)
        raise TopologyError(f"{filename}:{line}: {e}" if line else f"{filename}: {e}") from None


_STEP = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def _line_of(root: yaml.Node | None, key: str) -> int | None:
    """The 1-based line of ``key`` ("nodes[2].voter") in the composed document, or of its
    nearest ancestor that exists."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for m in _STEP.finditer(key):
        if isinstance(node, yaml.MappingNode) and m.group(1) is not None:
            hit = next((kv for kv in node.value if kv[0].value == m.group(1)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and m.group(2) is not None:
            i = int(m.group(2))
            if i >= len(node.value):
                break
            node = node.value[i]
            line = node.start_mark.line + 1
        else:
            break
    return line


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
    return from_text(DEFAULT, "<default topology>")
