"""The whole cluster on one screen: what an operator asks first, aggregated per datacenter.

Why a separate view: the per-node dashboard lists one row per (version, holder), which is
unreadable past a few dozen nodes. This one answers "what is the latest version, how far
has it spread in each datacenter, how fast, and who is not alive" in rows per datacenter,
so 500 nodes fit on a screen. It is pure (the gossip view, the committed versions and a
clock go in; a JSON-able dict comes out); :mod:`tensorhub.status_http` serves it.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .core.gossip import Status
from .core.gossip.core import GossipCore
from .core.naming import display_name

MAX_LISTED = 50
"""Nodes that are not alive, listed by name (beyond that: counted only)."""

RATE_WINDOW = 5.0
"""Seconds over which the spread rate is measured (the oldest sample in it is the base)."""


@dataclass
class SpreadRate:
    """Chunks held across the cluster, sampled over time: their growth is the cluster's
    aggregate fetch throughput (every verified chunk is a held chunk)."""

    samples: deque[tuple[float, dict[tuple[str, int], int]]] = field(default_factory=deque)

    def observe(self, now: float, held: dict[tuple[str, int], int]) -> dict[tuple[str, int], float]:
        """Record ``held`` at ``now``; chunks per second for each version over the window."""
        self.samples.append((now, held))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()
        t0, base = self.samples[0]
        if now - t0 <= 0:
            return {k: 0.0 for k in held}
        return {k: max(0, n - base.get(k, 0)) / (now - t0) for k, n in held.items()}


def summarize(
    core: GossipCore,
    committed: Mapping[str, int],
    chunk_bytes: Mapping[tuple[str, int], float],
    rate: SpreadRate,
    now: float,
) -> dict[str, Any]:
    """The cluster as this node sees it.

    ``committed``: the newest committed version per model (from the registry) where known;
    for others the newest version any holder advertises is shown, marked as such.
    ``chunk_bytes``: bytes per chunk of the versions this node has a manifest of (to turn
    chunks per second into bytes per second)."""
    status_of: dict[str, str] = {}
    dc_of: dict[str, str] = {}
    for name in core.members.names():
        m = core.members.get(name)
        status_of[name] = m.status.name.lower() if m is not None else "unknown"
        dc_of[name] = m.locality.split("/")[0] if m is not None else "?"
    for name, m in core.dead_memory.items():
        status_of.setdefault(name, Status.DEAD.name.lower())
        dc_of.setdefault(name, m.locality.split("/")[0])

    dcs: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"alive": 0, "suspect": 0, "dead": 0, "unknown": 0}
    )
    not_alive: list[dict[str, str]] = []
    for name in sorted(status_of):
        dcs[dc_of[name]][status_of[name]] += 1
        if status_of[name] != "alive":
            not_alive.append({"name": name, "dc": dc_of[name], "status": status_of[name]})

    held: dict[tuple[str, int], int] = {}
    newest: dict[str, int] = {}
    for dp, version in core.holders.versions():
        held[(dp, version)] = sum(h.held for h in core.holders.holders(dp, version).values())
        newest[dp] = max(newest.get(dp, 0), version)
    speeds = rate.observe(now, held)

    models = []
    for dp in sorted(set(newest) | set(committed)):
        version = committed.get(dp, newest.get(dp, 0))
        per_dc: dict[str, dict[str, int]] = defaultdict(lambda: {"complete": 0, "partial": 0})
        num_chunks = 0
        for name, h in core.holders.holders(dp, version).items():
            num_chunks = max(num_chunks, h.num_chunks)
            n = h.held
            if status_of.get(name) == "dead":
                continue
            per_dc[dc_of.get(name, "?")]["complete" if n == h.num_chunks else "partial"] += 1
        per_chunk = chunk_bytes.get((dp, version))
        chunks_per_s = speeds.get((dp, version), 0.0)
        models.append(
            {
                "model": display_name(dp),
                "latest": version,
                "committed": dp in committed,
                "chunks": num_chunks,
                "per_dc": {dc: dict(v) for dc, v in sorted(per_dc.items())},
                "chunks_per_s": chunks_per_s,
                "bytes_per_s": chunks_per_s * per_chunk if per_chunk else None,
            }
        )
    return {
        "time": now,
        "members": {
            k: sum(d[k] for d in dcs.values()) for k in ("alive", "suspect", "dead", "unknown")
        },
        "dcs": {dc: dict(v) for dc, v in sorted(dcs.items())},
        "models": models,
        "not_alive": not_alive[:MAX_LISTED],
        "not_alive_total": len(not_alive),
    }
