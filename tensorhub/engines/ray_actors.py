"""For RL frameworks that already place their workers with Ray: a Hub inside your actors.

verl, OpenRLHF, NeMo-RL and SkyRL hold trainer and rollout workers as Ray actors; they do
not want a launcher of ours. Two calls fit tensorhub into that:

- :func:`start_voters` starts the version registry (3 or 5 small voter actors) and
  returns its seeds;
- :func:`hub_in_actor`, called inside any of your actors, starts a
  :class:`~tensorhub.SyncHub` there: its locality comes from Ray (the datacenter from the
  node's ``tensorhub-dc-<dc>`` resource if it has one, the rack is the Ray node), and it
  listens on the node's address.

::

    seeds, voters = start_voters(secret=S)              # in the driver
    @ray.remote
    class Rollout:
        def __init__(self, seeds):
            self.hub = hub_in_actor(seeds, secret=S)     # then hub.fetch / hub.stream
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from typing import Any

import ray

from ..hub import Hub, SyncHub
from ..io.loop import run

DC_PREFIX = "tensorhub-dc-"


def _single_node() -> bool:
    return len([n for n in ray.nodes() if n.get("Alive")]) == 1


def _host() -> str:
    """Where a Hub in this actor listens: its node's address (loopback on a one-machine
    cluster: nothing else needs to reach it)."""
    return "127.0.0.1" if _single_node() else ray.util.get_node_ip_address()


def ray_locality(name: str, dc: str | None = None) -> str:
    """``dc/rack/name`` for a Hub in the calling actor: ``dc`` or the node's
    ``tensorhub-dc-<dc>`` resource ("dc0" without one); the rack is the Ray node, so
    actors on one machine are each other's nearest peers."""
    node_id = ray.get_runtime_context().get_node_id()
    if dc is None:
        mine: dict[str, Any] = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
        keys = [k for k in mine.get("Resources", {}) if k.startswith(DC_PREFIX)]
        dc = keys[0][len(DC_PREFIX) :] if keys else "dc0"
    return f"{dc}/node-{node_id[:12]}/{name}"


def hub_in_actor(
    seeds: list[str], *, secret: str, name: str | None = None, dc: str | None = None, **kw: Any
) -> SyncHub:
    """Start a (non-voting) Hub inside the calling Ray actor."""
    if name is None:
        actor = ray.get_runtime_context().get_actor_id() or "driver"
        name = f"ray-{actor[:12]}"
    return SyncHub(
        name=name,
        locality=ray_locality(name, dc),
        listen=f"{_host()}:0",
        seeds=seeds,
        secret=secret,
        **kw,
    )


@ray.remote(num_cpus=0)
class VoterActor:
    """One Raft voter of the version registry (and a gossip seed), on its own loop."""

    def reserve(self) -> str:
        host = _host()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"

    def serve(self, name: str, listen: str, seeds: list[str], secret: str, dc: str | None) -> None:
        """Runs until the actor is killed (``ray.kill``, or the job ends)."""

        async def main() -> None:
            with tempfile.TemporaryDirectory(prefix="tensorhub-voter-") as data:
                hub = await Hub.start(
                    name,
                    locality=ray_locality(name, dc),
                    listen=listen,
                    seeds=seeds,
                    voter=True,
                    data_dir=data,
                    secret=secret,
                )
                try:
                    await asyncio.Event().wait()
                finally:
                    await hub.close()

        run(main())


def start_voters(
    *, secret: str, count: int = 3, dc: str | None = None
) -> tuple[list[str], list[Any]]:
    """Start ``count`` voter actors; returns their addresses (everyone's seeds) and the
    actor handles (keep them: the registry lives as long as they do)."""
    actors = [VoterActor.remote() for _ in range(count)]  # type: ignore[attr-defined]
    seeds: list[str] = ray.get([a.reserve.remote() for a in actors])
    for i, a in enumerate(actors):
        a.serve.remote(f"voter{i}", seeds[i], seeds, secret, dc)
    return seeds, actors
