"""For RL frameworks that already place their workers with Ray: a Hub inside your actors.

verl, OpenRLHF, NeMo-RL and SkyRL hold trainer and rollout workers as Ray actors; they do
not want a launcher of ours. Two calls fit tensorhub into that:

- :func:`start_voters` starts the version registry (3 or 5 small voter actors) and
  returns its seeds (:func:`stop_voters` ends it, removing each voter's log);
- :func:`hub_in_actor`, called inside any of your actors, starts a
  :class:`~tensorhub.SyncHub` there: its locality comes from Ray (the datacenter from the
  node's ``tensorhub-dc-<dc>`` resource if it has one, the rack is the Ray node), and it
  listens on the node's address.

::

    seeds, voters = start_voters(secret=S)              # in the driver (stop_voters(voters))
    @ray.remote
    class Rollout:
        def __init__(self, seeds):
            self.hub = hub_in_actor(seeds, secret=S)     # then hub.fetch / hub.stream
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import threading
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
    """One Raft voter of the version registry (and a gossip seed), on its own loop. Two
    threads (``max_concurrency=2``, set by :func:`start_voters`): :meth:`serve` holds one
    for the voter's life, :meth:`stop` takes the other.
    (Killed instead, as ``ray.shutdown()`` does, it left its Raft log and gossip state in
    a temporary directory for good: three per run of examples/ray_rl.py.)"""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._serving = threading.Event()  # _loop and _stop are set
        self._ended = threading.Event()  # serve returned: its directory is gone

    def reserve(self) -> str:
        host = _host()
        with socket.socket() as s:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"

    def serve(self, name: str, listen: str, seeds: list[str], secret: str, dc: str | None) -> None:
        """Runs until :meth:`stop` (or until the actor is killed)."""

        async def main() -> None:
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._serving.set()
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
                    await self._stop.wait()
                finally:
                    await hub.close()

        try:
            run(main())
        finally:
            self._ended.set()

    def stop(self, timeout: float = 30.0) -> bool:
        """End :meth:`serve` (the voter leaves, its directory is removed); whether it
        ended within ``timeout`` seconds."""
        if not self._serving.wait(timeout):  # (serve never began)
            return self._ended.is_set()
        assert self._loop is not None and self._stop is not None
        if not self._ended.is_set():
            # (its loop closed meanwhile: serve is ending by itself)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        return self._ended.wait(timeout)


def start_voters(
    *, secret: str, count: int = 3, dc: str | None = None
) -> tuple[list[str], list[Any]]:
    """Start ``count`` voter actors; returns their addresses (everyone's seeds) and the
    actor handles (keep them: the registry lives as long as they do)."""
    actors = [
        VoterActor.options(max_concurrency=2).remote()  # type: ignore[attr-defined]
        for _ in range(count)
    ]
    seeds: list[str] = ray.get([a.reserve.remote() for a in actors])
    for i, a in enumerate(actors):
        a.serve.remote(f"voter{i}", seeds[i], seeds, secret, dc)
    return seeds, actors


def stop_voters(actors: list[Any], timeout: float = 30.0) -> bool:
    """Stop the voters :func:`start_voters` started, each removing its Raft log, then let
    go of the actors; whether every one stopped within ``timeout`` seconds (one that did
    not is killed, its directory left). Call it before ``ray.shutdown()``, which kills
    them all otherwise."""
    ended = ray.get([a.stop.remote(timeout) for a in actors])
    for a in actors:
        ray.kill(a, no_restart=True)
    return all(ended)
