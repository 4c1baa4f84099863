"""The systems TensorHub is compared with, each in its strongest honest form.

- ``nccl``: a pipelined ring broadcast at line rate over a static group (closed form: the
  ring moves ``S`` through every member at the slowest ring link's rate plus one chunk per
  hop to fill the pipe), after a barrier that waits for the slowest rollout, and after a
  group rebuild when membership changed.
- ``ucx``: every receiver pulls its copy from the trainer's hosts, each trainer host sending
  its slice (point to point, fan-out contention on the trainer NICs): flows on the same
  max-min network the swarm runs on.
- ``storage``: the trainer pushes its slices into a store of ``storage_hosts`` NICs, then
  every receiver pulls the whole model from the store.
- naive cross-DC is ``ucx`` with receivers behind the WAN.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from .engine import Engine
from .network import Link, Network
from .topology import Cluster


@dataclass
class Pulls:
    """When each receiver's copy was complete, and when the last byte left a sender."""

    done: dict[str, float]
    senders_free: float
    wan_bytes: float


def _wan_bytes(c: Cluster) -> float:
    return sum(link.carried for link in c.wan.values())


def ring_broadcast(
    size: float, members: int, rate: float, chunk: float, hop_latency: float
) -> float:
    """Seconds for a pipelined ring broadcast of ``size`` over ``members`` at ``rate``."""
    return size / rate + (members - 1) * (chunk / rate + hop_latency)


def wan_outage(e: Engine, net: Network, c: Cluster, window: tuple[float, float] | None) -> None:
    """Cut every WAN link during ``window`` (a partitioned datacenter), then restore it."""
    if window is None:
        return
    for link in c.wan.values():
        rate = link.capacity
        e.at(window[0], functools.partial(net.set_capacity, link, 0.0))
        e.at(window[1], functools.partial(net.set_capacity, link, rate))


def pull_from_trainer(
    c: Cluster,
    trainers: Sequence[str],
    receivers: dict[str, float],
    size: float,
    outage: tuple[float, float] | None = None,
) -> Pulls:
    """Each receiver, at its start time, pulls ``size / len(trainers)`` from every trainer."""
    e = Engine()
    net = Network(e)
    wan_outage(e, net, c, outage)
    done: dict[str, float] = {}
    free = [0.0]
    part = size / len(trainers)

    def begin(r: str) -> None:
        left = [len(trainers)]

        def one() -> None:
            left[0] -= 1
            free[0] = max(free[0], e.now)
            if left[0] == 0:
                done[r] = e.now

        for t in trainers:
            net.start(c.path(t, r), part, one, latency=c.latency(t, r), tag=f"{t}>{r}")

    for r, at in receivers.items():
        e.at(at, functools.partial(begin, r))
    e.run()
    return Pulls(done, free[0], _wan_bytes(c))


def push_then_pull(
    c: Cluster,
    trainers: Sequence[str],
    receivers: dict[str, float],
    size: float,
    storage_hosts: int,
) -> Pulls:
    """The trainer writes its slices to a store; each receiver reads the whole model from it
    once the write is done and it has paused. The store sits behind the datacenter's core
    (its own links of ``storage_hosts`` NICs each way)."""
    e = Engine()
    net = Network(e)
    nic = c.spec.nic_gbytes * 1e9 * c.spec.efficiency
    store_in = Link("store/in", storage_hosts * nic)
    store_out = Link("store/out", storage_hosts * nic)
    done: dict[str, float] = {}
    pushed = [0.0, len(trainers)]

    def pull(r: str) -> None:
        h = c.hosts[r]
        path = [store_out, c.rack_down[(h.dc, h.rack)], h.down]
        net.start(path, size, lambda: done.__setitem__(r, e.now), tag=f"store>{r}")

    def pushed_one() -> None:
        pushed[1] -= 1
        if pushed[1] == 0:
            pushed[0] = e.now
            for r, at in receivers.items():
                e.at(max(at, e.now), functools.partial(pull, r))

    for t in trainers:
        h = c.hosts[t]
        net.start([h.up, c.rack_up[(h.dc, h.rack)], store_in], size / len(trainers), pushed_one)
    e.run()
    return Pulls(done, pushed[0], _wan_bytes(c))
