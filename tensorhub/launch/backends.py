"""Where a launch runs its nodes: local processes, or actors on a Ray cluster.

The launcher needs the same few things from either: a queue its nodes report events on,
a stop signal they wait for, listen addresses for the voters (the cluster's seeds), and a
handle per node to ask whether it is alive and to kill it (chaos). A backend provides
those; the launcher's loop, chaos and report are the same for both.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..io.tcp import local_addresses
from .topology import NodeSpec
from .workers import Plan

Main = Callable[[Plan, Any, Any], None]


class NodeHandle(Protocol):
    """One running node, as the launcher sees it (a ``multiprocessing.Process`` is one)."""

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


class Backend(Protocol):
    out: Any  # .put(event) from nodes, .get(timeout=) here (queue.Empty when none)
    stop: Any  # .set() here, .wait() in nodes

    def listen_addresses(self, nodes: Sequence[NodeSpec]) -> dict[str, str]:
        """Where each node listens ("host:port"; port 0 for any): voters need fixed ones."""
        ...

    def start(self, node: NodeSpec, main: Main, plan: Plan) -> NodeHandle: ...

    def close(self) -> None: ...


class Processes:
    """Every node a process on this machine (spawned: no state shared with the launcher)."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.out = self.ctx.Queue()
        self.stop = self.ctx.Event()

    def listen_addresses(self, nodes: Sequence[NodeSpec]) -> dict[str, str]:
        voters = local_addresses([n.name for n in nodes if n.voter])
        return {n.name: voters.get(n.name, "127.0.0.1:0") for n in nodes}

    def start(self, node: NodeSpec, main: Main, plan: Plan) -> NodeHandle:
        p = self.ctx.Process(target=main, args=(plan, self.out, self.stop), daemon=True)
        p.name = node.name
        p.start()
        return p

    def close(self) -> None:
        pass


def backend(name: str, ray_address: str | None = None) -> Backend:
    if name == "process":
        return Processes()
    if name == "ray":
        from .ray_backend import RayActors

        return RayActors(ray_address)
    raise ValueError(f"unknown backend {name!r}: process or ray")
