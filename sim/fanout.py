"""The NIC-limited fan-out of ``bench/linerate.py``, simulated: one publisher and N
receivers in one rack, every NIC at the same rate, the node's data-plane settings and its
4 MiB chunks: store and forward (a chunk served once verified), or with the preset's
``cut_through`` served as it lands; either way announced once whole, as the node does.

The bench's cases with a victim are modelled as the bench makes them: a slower NIC, a
late start, a crash (``Swarm.crash``), the publisher withdrawing (``Swarm.withdraw``).
It runs the same planner, fetch session and serve decision as the node, so its
prediction is a check of the simulator's network model against the real namespaces, not
of the protocol: the bench prints both side by side.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from tensorhub.core.swarm.presets import DataPlaneConfig

from .engine import Engine
from .network import Network
from .swarm import Swarm, SwarmConfig
from .topology import Cluster, TopologySpec

NODE_TICK = 0.01  # the node's planner tick, seconds


def predict_each(
    receivers: int,
    size: int,
    rate_mbit: float,
    chunk: int,
    dataplane: DataPlaneConfig,
    seed: int = 1,
    rates: Mapping[int, float] | None = None,
    late: Mapping[int, float] | None = None,
    killed: Mapping[int, float] | None = None,
    stops: bool = False,
    steps: int = 1,
    trace: str | Path | None = None,
    check_due: bool = False,
) -> list[float]:
    """Each receiver's time over one copy's (size / rate), simulated, receivers 1..N in
    order, from its own start; ``rates``: receiver -> its NIC's rate (Mbit/s) where not
    ``rate_mbit`` (the bench's slow receiver, both ways, as ``Fabric(rates=...)``);
    ``late``: receiver -> when it begins its fetch, in copies (the bench's late joiner);
    ``killed``: receiver -> when it dies, in copies (inf for it); ``stops``: the publisher
    withdraws its copy once one receiver holds the whole version (the bench's "stops").
    ``steps``: the last of that many fetches of successive versions, each beginning with
    the laggards of the one before at the chain's tail (the node's lag memory); the victim
    is killed in the last alone (the bench's ``--steps``). ``trace``: a directory to write
    the last fetch's timeline into (``simulated.jsonl``), in the events a node writes
    under ``TENSORHUB_TRACE`` (seconds of simulated time; the publisher and receivers
    named as bench/linerate.py names them), for ``bench/trace_report.py``.
    ``check_due``: plan every tick and check each call the planner's memo answers
    (SwarmConfig.check_due; tests)."""
    if steps < 1:
        raise ValueError(f"steps wants a count >= 1, not {steps}")
    lagged: frozenset[int] = frozenset()
    times: list[float] = []
    for step in range(1, steps + 1):
        last = step == steps
        times, lagged = _fetch(
            receivers, size, rate_mbit, chunk, dataplane, seed, rates, late,
            killed if last else None, stops, lagged, trace if last else None, check_due,
        )  # fmt: skip
    return times


def _fetch(
    receivers: int,
    size: int,
    rate_mbit: float,
    chunk: int,
    dataplane: DataPlaneConfig,
    seed: int,
    rates: Mapping[int, float] | None,
    late: Mapping[int, float] | None,
    killed: Mapping[int, float] | None,
    stops: bool,
    lagged_before: frozenset[int],
    trace: str | Path | None = None,
    check_due: bool = False,
) -> tuple[list[float], frozenset[int]]:
    """One fetch of :func:`predict_each`: each receiver's time, and the receivers whose
    relay fell behind."""
    spec = TopologySpec(
        dcs=1,
        racks_per_dc=1,
        hosts_per_rack=receivers + 1,
        nic_gbytes=rate_mbit / 8e3,
        efficiency=1.0,
        oversubscription=1.0,
        hop_latency=5e-5,
    )
    e = Engine()
    net = Network(e)
    c = Cluster.build(spec)
    hosts = sorted(c.hosts)
    for i, mbit in (rates or {}).items():
        host = c.hosts[hosts[i]]
        host.up.capacity = host.down.capacity = mbit * 1e6 / 8
    cfg = SwarmConfig.of(
        dataplane,
        chunks=max(1, math.ceil(size / chunk)),
        early_hints=False,
        tick=NODE_TICK,
        member_grace=dataplane.planner.member_grace,  # (the node's, in its own ticks)
        check_due=check_due,
    )
    s = Swarm(
        e, net, c, float(size), [hosts[0]], hosts[1:], cfg, seed=seed,
        lagged_before={hosts[i] for i in lagged_before},
    )  # fmt: skip
    one = size / (rate_mbit * 1e6 / 8)
    out = None
    if trace is not None:
        Path(trace).mkdir(parents=True, exist_ok=True)
        out = (Path(trace) / "simulated.jsonl").open("w", encoding="utf-8")
        s.timeline = _timeline_writer(out, e, hosts)
    starts = {f: (late or {}).get(i, 0.0) * one for i, f in enumerate(hosts[1:], 1)}
    s.start(at=starts)
    for i, at in (killed or {}).items():
        e.at(at * one, functools.partial(s.crash, hosts[i]))
    if stops:

        def first_copy(_f: str) -> None:
            if not s.nodes[hosts[0]].withdrawn:
                s.withdraw(hosts[0])

        s.on_done = first_copy
    try:
        e.run()
    finally:
        if out is not None:
            out.close()
    times = [((s.nodes[f].finished or math.inf) - starts[f]) / one for f in hosts[1:]]
    laggards = s.laggards
    return times, frozenset(i for i, f in enumerate(hosts[1:], 1) if f in laggards)


def _timeline_writer(
    out: TextIO, e: Engine, hosts: list[str]
) -> Callable[[str, str, dict[str, object]], None]:
    """``Swarm.timeline`` writing JSON lines as ``tensorhub/dataplane/trace.py`` does,
    each host named as the bench names its node (publisher, r1, r2, ...)."""
    names = {h: ("publisher" if i == 0 else f"r{i}") for i, h in enumerate(hosts)}

    def name(v: object) -> object:
        return names.get(v, v) if isinstance(v, str) else v

    def write(f: str, ev: str, fields: dict[str, object]) -> None:
        named = {k: name(v) if k in ("src", "to", "up", "addr") else v for k, v in fields.items()}
        line = {"t": round(e.now, 6), "node": names[f], "model": "simulated", "version": 1}
        out.write(json.dumps({**line, "ev": ev, **named}) + "\n")

    return write
