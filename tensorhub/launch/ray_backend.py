"""Run a launch on a Ray cluster: one actor per node, the launcher as the Ray driver.

RL frameworks (verl, OpenRLHF, NeMo-RL, SkyRL) place trainers and rollouts with Ray; the
same topology that runs as local processes runs here as actors, with the same loop, chaos
(``ray.kill``), summary and JSON. Placement: a Ray node that offers the custom resource
``tensorhub-dc-<dc>`` (``ray start --resources='{"tensorhub-dc-dc1": 1000}'``) takes the
topology's nodes of datacenter ``<dc>``; without such resources Ray places actors freely
and each node keeps the locality the topology gives it. Nodes listen on their Ray node's
address (loopback when the cluster is this one machine). The summary's stall times
subtract one process's monotonic clock from another's: exact on one machine, approximate
across machines.

``ray`` is imported only here: ``pip install ray`` (the dev extra has it).
"""

from __future__ import annotations

import queue
import socket
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ray

from .backends import Main, NodeHandle
from .topology import NodeSpec
from .workers import Plan

DC_RESOURCE = "tensorhub-dc-{}"


@ray.remote(num_cpus=0)
class _Flag:
    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@ray.remote(num_cpus=0)
class _Mailbox:
    """Events in the order each sender sent them; taken in batches, never dropped.

    A plain (non-async) actor that only appends and hands over: nothing in it waits.
    """

    def __init__(self) -> None:
        self._items: list[Any] = []

    def put(self, item: Any) -> None:
        self._items.append(item)

    def take(self) -> list[Any]:
        items, self._items = self._items, []
        return items


class RayEvents:
    """The launcher's event queue across a Ray cluster (what ``mp.Queue`` is locally).

    ``put`` does not wait: nodes call it from inside their event loop, where a blocking
    round trip to an actor stops the node (gossip, Raft, transfers) for as long as Ray
    takes to answer. With ``ray.util.queue.Queue`` (a blocking ``put``) a launch with both
    cores busy stalled after v1 to its timeout in 5 of 5 tries; a put there took 21 ms on
    average and more in bursts. With this channel 3 of 3 such launches finished. Ray runs
    one caller's calls to an actor in the order they were made, so each node's events
    stay in order; ``get`` keeps its one outstanding ``take`` across timeouts, so a batch
    that comes back late is delivered, not dropped.
    """

    def __init__(self) -> None:
        self._box = _Mailbox.remote()  # type: ignore[attr-defined]
        self._ready: deque[Any] = deque()
        self._taking: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_box": self._box}  # nodes only put: the reader's state stays here

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._box, self._ready, self._taking = state["_box"], deque(), None

    def put(self, item: Any) -> None:
        self._box.put.remote(item)

    def get(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self._taking is None:
                self._taking = self._box.take.remote()
            left = deadline - time.monotonic()
            done, _ = ray.wait([self._taking], timeout=max(left, 0.0))
            if not done:
                raise queue.Empty
            batch, self._taking = ray.get(self._taking), None
            self._ready.extend(batch)
            if not batch:
                if deadline - time.monotonic() <= 0:
                    raise queue.Empty
                time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
        return self._ready.popleft()


class RayStop:
    """A stop signal nodes can wait on from any Ray node (what ``mp.Event`` is locally)."""

    def __init__(self) -> None:
        self._flag = _Flag.remote()  # type: ignore[attr-defined]

    def set(self) -> None:
        ray.get(self._flag.set.remote())

    def is_set(self) -> bool:
        return bool(ray.get(self._flag.is_set.remote()))

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


@ray.remote(num_cpus=0)
class NodeActor:
    """Hosts one tensorhub node (a Hub is I/O-bound: it asks Ray for no CPU)."""

    def host(self, single_node: bool) -> str:
        return "127.0.0.1" if single_node else ray.util.get_node_ip_address()

    def reserve(self, host: str) -> str:
        """A free port on this actor's node, for a voter (the seeds are fixed up front)."""
        with socket.socket() as s:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"

    def run(self, main: Main, plan: Plan, out: Any, stop: Any) -> None:
        with tempfile.TemporaryDirectory(prefix="tensorhub-ray-") as data:
            main(replace(plan, data_dir=data), out, stop)  # a voter's log on its own node


class ActorHandle:
    """A node's actor and its ``run`` call, answering as a process does."""

    def __init__(self, actor: Any, ref: Any) -> None:
        self.actor, self.ref = actor, ref

    @property
    def exitcode(self) -> int | None:
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            ray.get(self.ref)
        except Exception:  # the actor died (killed, or its node failed) or raised
            return 1
        return 0

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        ray.wait([self.ref], timeout=timeout)


class RayActors:
    """The Ray backend: joins ``address`` (a running cluster; None starts a local one)."""

    def __init__(self, address: str | None) -> None:
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        self.out = RayEvents()
        self.stop = RayStop()
        self._single = len([n for n in ray.nodes() if n.get("Alive")]) == 1
        self._resources = set(ray.cluster_resources())
        self._actors: dict[str, Any] = {}

    def _actor(self, node: NodeSpec) -> Any:
        if node.name not in self._actors:
            want = DC_RESOURCE.format(node.dc)
            opts: dict[str, Any] = {"name": None}
            if want in self._resources:
                opts["resources"] = {want: 0.001}
            self._actors[node.name] = NodeActor.options(**opts).remote()  # type: ignore[attr-defined]
        return self._actors[node.name]

    def listen_addresses(self, nodes: Sequence[NodeSpec]) -> dict[str, str]:
        hosts = ray.get([self._actor(n).host.remote(self._single) for n in nodes])
        out = {n.name: f"{h}:0" for n, h in zip(nodes, hosts, strict=True)}
        voters = [n for n in nodes if n.voter]
        addrs = ray.get([self._actor(n).reserve.remote(out[n.name][:-2]) for n in voters])
        out.update({n.name: a for n, a in zip(voters, addrs, strict=True)})
        return out

    def start(self, node: NodeSpec, main: Main, plan: Plan) -> NodeHandle:
        actor = self._actor(node)
        return ActorHandle(actor, actor.run.remote(main, plan, self.out, self.stop))

    def close(self) -> None:
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()
        if self._started:
            ray.shutdown()
