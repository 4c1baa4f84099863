"""A cluster of Hub processes on this machine, driven step by step through pipes.

Each node is a separate process (spawned: no state shared with the parent) running a real
:class:`~tensorhub.Hub` on loopback; the parent sends it commands — publish, fetch,
unpublish, corrupt what you hold, report — and gets the results back, so multi-process
tests and benchmarks can stage exact scenarios (kill -9 a holder mid-fetch, a holder
turning corrupt, unpublish during uploads) on the real stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core.naming import shard_key, split_key
from ..dataplane.store import Replica
from ..hub import Hub
from ..io.loop import run
from ..io.tcp import local_addresses
from ..io.tensors import empty_like_manifest, tensor_digests
from .netns import enter
from .weights import llm_like_state_dict, nudged

SECRET = "tensorhub-test-cluster"


@dataclass(frozen=True)
class Spec:
    name: str
    locality: str  # dc/rack/host
    voter: bool = False
    seed_spare: bool | None = None
    """Hub.seed_spare, repeat copies from an idle publisher uplink (None: the preset's). Until
    session 23 it was True by default and overrode every preset's, the relay's off included:
    bench/linerate.py's relay rows before then ran with repeat copies."""
    netns: str | None = None  # run in this network namespace (see testing/netns.py)
    listen: str | None = None  # where to listen (default: loopback; voters on fixed ports)
    dataplane: str = "node"  # the data-plane preset (core/swarm/presets.py)


def _shard0(hub: Hub, model: str, version: int) -> list[Replica]:
    """This node's replicas of shard 0 of (model, version) (a whole model is its shard 0)."""
    return [r for r in hub.node.store if r.version == version and split_key(r.key) == (model, 0)]


class _Worker:
    """The child side: one Hub and what it publishes or fetches into."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.buffers: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.fetches: dict[tuple[str, int], asyncio.Task[tuple[Any, ...]]] = {}

    async def handle(self, cmd: str, args: list[Any]) -> tuple[Any, ...]:
        hub = self.hub
        if cmd == "publish":  # model, version, size, seed[, chunk size]
            model, version, size, seed, *chunk = args
            sd = self.buffers[(model, version)] = llm_like_state_dict(size, seed)
            pub = await hub.publish(
                model, version, sd, **({"chunk_size": chunk[0]} if chunk else {})
            )
            return ("ok", pub.committed)
        if cmd == "step":  # model, old, new, fraction, seed: v_new a small step from v_old,
            # published with a delta from it (v_old stays served: the delta needs it)
            model, old, new, fraction, seed = args
            sd = self.buffers[(model, new)] = nudged(self.buffers[(model, old)], seed, fraction)
            pub = await hub.publish(model, new, sd, delta_from=old)
            return ("ok", pub.committed)
        if cmd == "serve":  # model, version, size, seed: a plain holder, no registry
            model, version, size, seed = args
            sd = self.buffers[(model, version)] = llm_like_state_dict(size, seed)
            hub.node.serve(model, version, sd)
            return ("ok",)
        if cmd == "unpublish":  # model, version, keep_copy; then scribble over the buffers
            model, version, keep = args
            kept = await hub.unpublish(model, version, keep_copy=keep)
            for t in self.buffers.pop((model, version)).values():
                t.zero_()  # the caller may reuse its memory now: prove nothing still reads it
            return ("ok", kept)
        if cmd == "wait_replicated":
            model, version, copies = args
            await hub.wait_replicated(model, version, copies=copies)
            return ("ok",)
        if cmd == "prepare":  # model, version, addr: allocate destination tensors (untimed)
            model, version, addr = args
            if addr is None:
                m = await hub.manifest(model, version)
            else:
                m = await (await hub.node.peer(addr)).get_manifest(model, version)
            # Zeroed off the event loop: gossip goes on answering meanwhile (zeroing 1 GiB
            # on a busy 2-core host takes seconds; receivers then began fetching on views
            # that lacked members: docs/results.md, session 26).
            self.buffers[(model, version)] = await asyncio.to_thread(empty_like_manifest, m)
            return ("ok",)
        if cmd == "fetch":  # model, version, addr (None: through the Hub, the swarm)
            model, version, addr = args  # starts it; "result" waits for it
            self.fetches[(model, version)] = asyncio.ensure_future(
                self._fetch(model, version, addr)
            )
            return ("ok",)
        if cmd == "reuse":  # model, old, new: fetch `new` into the buffers `old` was fetched into
            model, old, new = args
            self.buffers[(model, new)] = self.buffers.pop((model, old))
            return ("ok",)
        if cmd == "retain":  # model, version
            model, version = args
            await hub.retain(model, version)
            return ("ok",)
        if cmd == "release":  # model, version
            model, version = args
            await hub.release(model, version)
            return ("ok",)
        if cmd == "drop":  # model, version: stop serving a fetched copy, free its memory
            model, version = args
            await hub.unpublish(model, version, keep_copy=False)
            self.buffers.pop((model, version), None)
            return ("ok",)
        if cmd == "control":  # the size of this node's control-plane state
            core = hub.gossip.core
            return (
                "ok",
                {
                    "gossip_keys": sum(len(st.kvs) for st in core.state.nodes.values()),
                    "holder_versions": len(core.holders.versions()),
                    "replicas": len(hub.node.store),
                },
            )
        if cmd == "result":
            model, version = args
            return await self.fetches.pop((model, version))
        if cmd == "digests":
            model, version = args
            return ("ok", tensor_digests(self.buffers[(model, version)]))
        if cmd == "complete":  # whether this node holds all of shard 0 of (model, version)
            return ("ok", any(r.complete for r in _shard0(hub, *args)))
        if cmd == "progress":  # chunks of shard 0 of (model, version) verified here
            return ("ok", max((r.held for r in _shard0(hub, *args)), default=0))
        if cmd == "corrupt":  # flip bits in what we hold: our replica no longer matches
            model, version = args
            for t in self.buffers[(model, version)].values():
                if t.numel() and t.is_floating_point():
                    t.view(-1)[: t.numel() // 2].neg_()
            return ("ok",)
        if cmd == "lag_memory":  # model: whose relay fell behind in its last fetch of
            # shard 0, as this node's gossip holds it (HolderView.lagged)
            (model,) = args
            return ("ok", sorted(hub.gossip.core.holders.lagged(shard_key(model, 0))))
        if cmd == "view":  # what this node's gossip says of each member it knows
            core = hub.gossip.core
            return ("ok", {m.name: m.status.name.lower() for m in core.members.records()})
        if cmd == "stats":
            return ("ok", dict(hub.node.upload_grants.bytes_to))
        return ("error", f"unknown command {cmd!r}")

    async def _fetch(self, model: str, version: int, addr: str | None) -> tuple[Any, ...]:
        into = self.buffers[(model, version)]
        t0 = time.monotonic()
        received: dict[str, int] = {}
        delta: dict[str, Any] = {}
        if addr is None:
            res = await self.hub.fetch(model, version, into)
            failures = dict(res.failures)
            received = dict(res.sources)
            delta = {
                "base": res.delta_base,
                "bytes": res.delta_bytes,
                "rebuilt": res.delta_chunks,
                "refused": res.delta_refused,
                "whole_bytes": res.bytes,
            }
        else:
            await self.hub.node.fetch(addr, model, version, into, hold=False)
            failures = {}
        return ("done", t0, time.monotonic(), failures, received, delta)


def _child(spec: Spec, listen: str, seeds: list[str], data_dir: str, pipe: mpc.Connection) -> None:
    if spec.netns is not None:
        enter(spec.netns)  # before any socket or thread

    async def main() -> None:
        hub = await Hub.start(
            spec.name,
            locality=spec.locality,
            listen=listen,
            seeds=seeds,
            voter=spec.voter,
            data_dir=data_dir if spec.voter else None,
            secret=SECRET,
            dataplane=spec.dataplane,
        )
        if spec.seed_spare is not None:
            hub.seed_spare = spec.seed_spare
        pipe.send(("ready", hub.address))
        worker = _Worker(hub)
        loop = asyncio.get_running_loop()
        try:
            while True:
                cmd, *args = await loop.run_in_executor(None, pipe.recv)
                if cmd == "stop":
                    return
                try:
                    pipe.send(await worker.handle(cmd, args))
                except Exception as e:  # reported to the parent, which raises it there
                    pipe.send(("error", f"{type(e).__name__}: {e}"))
        finally:
            await hub.close()

    run(main())


def lacking(views: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """For each node whose gossip view (member -> status, as the "view" command answers)
    does not hold every other node of ``views`` alive: those it lacks, sorted."""
    out = {}
    for name, view in views.items():
        missing = sorted(m for m in views if m != name and view.get(m) != "alive")
        if missing:
            out[name] = missing
    return out


class HubProcs:
    """Start the nodes of ``specs`` (voters listen on fixed ports, the seeds); drive them."""

    def __init__(self, specs: list[Spec], data_dir: str, timeout: float = 300.0) -> None:
        ctx = mp.get_context("spawn")
        self.specs = {s.name: s for s in specs}
        self.timeout = timeout
        voters = local_addresses([s.name for s in specs if s.voter and s.listen is None])
        voters.update({s.name: s.listen for s in specs if s.voter and s.listen is not None})
        seeds = list(voters.values())
        self.pipes: dict[str, mpc.Connection] = {}
        self.procs: dict[str, Any] = {}
        for s in specs:
            ours, theirs = ctx.Pipe()
            listen = voters.get(s.name, s.listen or "127.0.0.1:0")
            p = ctx.Process(
                target=_child, args=(s, listen, seeds, f"{data_dir}/{s.name}", theirs), daemon=True
            )
            p.start()
            theirs.close()  # the child's end is the child's: its death then reads as EOF here
            self.pipes[s.name], self.procs[s.name] = ours, p
        self.addr = {s.name: self.expect(s.name, "ready")[0] for s in specs}

    def dc(self, name: str) -> str:
        return self.specs[name].locality.split("/")[0]

    @property
    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.is_alive()]

    def send(self, names: list[str], *cmd: Any) -> None:
        for n in names:
            self.pipes[n].send(cmd)

    def expect(self, name: str, tag: str = "ok") -> list[Any]:
        if not self.pipes[name].poll(self.timeout):
            raise TimeoutError(f"{name} did not answer in {self.timeout}s")
        try:
            got, *rest = self.pipes[name].recv()
        except EOFError:
            proc = self.procs.get(name)
            if proc is not None:
                proc.join(5)
            code = None if proc is None else proc.exitcode
            raise RuntimeError(
                f"{name} exited (code {code}) before answering; its traceback is above"
            ) from None
        if got != tag:
            raise RuntimeError(f"{name}: {got}: {rest}")
        return list(rest)

    def call(self, names: list[str], *cmd: Any, tag: str = "ok") -> list[list[Any]]:
        self.send(names, *cmd)
        return [self.expect(n, tag) for n in names]

    def kill(self, name: str) -> None:
        """kill -9: no goodbye, no flush."""
        p = self.procs[name]
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process hangs with its sockets open (a stuck holder, as peers see
        it: TCP still accepts, nothing answers)."""
        os.kill(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGCONT)

    def wait_members(self, names: Collection[str], timeout: float = 60.0) -> float:
        """Wait until every node of ``names`` holds every other one alive (not suspect, not
        dead, not unknown); the seconds it took. A bench measures fetches in a healthy
        cluster: fetches that began while a node's view still missed members built their
        relay chains from that partial view (bench/linerate.py, N=8, 1 GiB: a receiver
        whose view held four of the eight, itself included, took chunks from the origin
        beside the chain's head, and the round took 1.46x one copy; docs/results.md,
        session 26)."""
        _, seconds = self._poll(names, ("view",), lacking, "membership", timeout, 0.05)
        return seconds

    def wait_lag_memory(
        self, names: Collection[str], model: str, timeout: float = 30.0
    ) -> list[str]:
        """Wait until every node of ``names`` holds the same lag memory of ``model`` (the
        nodes whose relay fell behind in their last fetch of it); that memory, by node name.
        An RL job's steps are seconds to minutes apart, so its next fetch begins on a memory
        every node holds; a bench that publishes the next step at once may begin a fetch on
        a view that lacks a node's memory, and that node chains as if the link were not
        slow. (Session 40 found none such in 20 traced two-step rounds without the wait;
        CI's failure of the remembered-step test, untraced, could have been one.)"""

        def differ(views: dict[str, Any]) -> dict[str, Any] | None:
            return views if len({tuple(m) for m in views.values()}) > 1 else None

        views, _ = self._poll(names, ("lag_memory", model), differ, "the lag memory", timeout, 0.02)
        return list(views[min(names)])

    def _poll(
        self,
        names: Collection[str],
        cmd: tuple[Any, ...],
        pending: Callable[[dict[str, Any]], object],
        what: str,
        timeout: float,
        every: float,
    ) -> tuple[dict[str, Any], float]:
        """Ask every node of ``names`` ``cmd`` every ``every`` seconds until ``pending`` of
        their answers (by name) is falsy: the answers, and the seconds it took. Past
        ``timeout``, TimeoutError with what ``pending`` last said."""
        t0 = time.monotonic()
        order = sorted(names)
        while True:
            answers = {n: a for n, (a,) in zip(order, self.call(order, *cmd), strict=True)}
            left = pending(answers)
            if not left:
                return answers, time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{what} did not converge in {timeout:.0f} s: {left}")
            time.sleep(every)

    def fetch_all(
        self, names: list[str], model: str, version: int, via: str | None
    ) -> tuple[float, dict[str, int], list[Any]]:
        """Every node of ``names`` fetches (model, version) at once (from ``via`` alone, or
        the swarm): the time from the first start to the last end, the bytes each node
        uploaded to each other meanwhile ("sender>receiver"), and each fetch's failures."""
        results, delta = self.fetch_each(names, model, version, via)
        seconds = max(t[1] for t in results.values()) - min(t[0] for t in results.values())
        return seconds, delta, [t[2] for t in results.values()]

    def fetch_each(
        self,
        names: list[str],
        model: str,
        version: int,
        via: str | None,
        started: Callable[[], None] | None = None,
        prepared: Callable[[], None] | None = None,
        hold: Collection[str] = (),
    ) -> tuple[dict[str, list[Any]], dict[str, int]]:
        """As :meth:`fetch_all`, node by node: ``prepared()`` is called once every node has
        its destination tensors (allocated and touched: a bench starts its CPU clock there,
        not before), ``started()`` once every fetch but those of ``hold`` has begun (a bench
        may kill one of them then, or begin a held one late: it must); returned are
        (start, end, failures) of each node still alive after it, by name, and the bytes
        uploaded meanwhile."""
        before = self.uploads()
        self.call(names, "prepare", model, version, via)
        if prepared is not None:
            prepared()
        self.call([n for n in names if n not in hold], "fetch", model, version, via)
        if started is not None:
            started()
        live = [n for n in names if n in self.alive]
        done = self.call(live, "result", model, version, tag="done")
        after = self.uploads()
        delta = {k: b - before.get(k, 0) for k, b in after.items() if b > before.get(k, 0)}
        return dict(zip(live, done, strict=True)), delta

    def uploads(self) -> dict[str, int]:
        """Bytes each live node uploaded to each other, as "sender>receiver" → bytes."""
        out: dict[str, int] = {}
        names = self.alive
        for n, (by_peer,) in zip(names, self.call(names, "stats"), strict=True):
            for peer, b in by_peer.items():
                out[f"{n}>{peer}"] = out.get(f"{n}>{peer}", 0) + b
        return out

    def close(self) -> None:
        for n in self.alive:
            with contextlib.suppress(OSError):
                self.pipes[n].send(("stop",))
        for p in self.procs.values():
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)

    def __enter__(self) -> HubProcs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
