"""Eight gossiping processes on loopback; two are killed with -9, then restarted.

Bound: with 20 ms ticks and 10-tick periods, Lifeguard's maximum suspicion timeout at
N = 8 is 4 x 1 x 6 = 24 periods (4.8 s); with a probe cycle and dissemination the
documented bound is DETECT_BOUND seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorhub.core.gossip import Status
from tensorhub.core.gossip.messages import GStatusReply, GStatusReq
from tensorhub.core.messages import Message
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.peer import PeerHandler

from ..procs import free_ports, kill, spawn

SECRET = "gossip-mp-secret"
DETECT_BOUND = 10.0


class Cluster:
    def __init__(self, tmp: Path, n: int = 8) -> None:
        self.addrs = [f"127.0.0.1:{p}" for p in free_ports(n)]
        self.names = [f"node{i}" for i in range(n)]
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.inc: dict[str, int] = {}

    def start(self, i: int, advertise: str = "") -> None:
        args = [
            "gossip-node",
            "--listen",
            self.addrs[i],
            "--name",
            self.names[i],
            "--locality",
            f"dc{i % 2}/rack{i % 4}/host{i}",
            "--seeds",
            ",".join(self.addrs[:3]),
            "--data-dir",
            str(self.tmp / f"n{i}"),
        ]
        if advertise:
            args += ["--advertise", advertise]
        self.procs[self.names[i]], words = spawn(args, SECRET)
        self.inc[self.names[i]] = int(words[2])

    def kill(self, name: str) -> None:
        kill(self.procs.pop(name))

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


class Observer:
    """Asks nodes for their view over the authenticated transport."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[GStatusReply]] = {}
        node.control[GStatusReply] = self._on_reply

    def _on_reply(self, _peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, GStatusReply)
        fut = self._waiting.pop(msg.req, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def view(self, addr: str) -> GStatusReply:
        req = next(self._ids)
        fut: asyncio.Future[GStatusReply] = asyncio.get_running_loop().create_future()
        self._waiting[req] = fut
        peer = await self.node.peer(addr)
        await peer.conn.send(GStatusReq(req))
        return await asyncio.wait_for(fut, 5)


async def wait_until(cond: object, timeout: float) -> float:
    t0 = time.monotonic()
    while True:
        if await cond():  # type: ignore[operator]
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(0.1)


async def test_kill_two_then_restart(cluster: Cluster) -> None:
    for i in range(8):
        cluster.start(i, advertise="policy/1" if i in (6, 7) else "")
    obs = Observer(await Node.start("observer", secret=SECRET))
    try:
        await _kill_two_then_restart(cluster, obs)
    finally:
        await obs.node.close()


async def _kill_two_then_restart(cluster: Cluster, obs: Observer) -> None:
    live = lambda: [cluster.addrs[i] for i, n in enumerate(cluster.names) if n in cluster.procs]  # noqa: E731

    async def statuses(addr: str) -> dict[str, int]:
        v = await obs.view(addr)
        return {u.name: u.status for u in v.members}

    async def all_alive() -> bool:
        for a in live():
            st = await statuses(a)
            if sorted(n for n, s in st.items() if s == Status.ALIVE) != sorted(cluster.names):
                return False
        return True

    async def holders_seen() -> bool:
        for a in live():
            v = await obs.view(a)
            seen = {(m, ver): set(h) for m, ver, h in v.holders}
            if seen.get(("policy", 1)) != {"node6", "node7"}:
                return False
        return True

    await wait_until(all_alive, 30)
    await wait_until(holders_seen, 30)  # every node lists both holders

    for name in ("node6", "node7"):
        cluster.kill(name)

    async def both_dead() -> bool:
        for a in live():
            st = await statuses(a)
            if any(st.get(n, Status.DEAD) != Status.DEAD for n in ("node6", "node7")):
                return False
        return True

    took = await wait_until(both_dead, DETECT_BOUND)
    print(f"6 live nodes marked both dead {took:.1f}s after kill -9 (bound {DETECT_BOUND}s)")
    for a in live():
        assert not (await obs.view(a)).holders  # their holdings died with them

    old = {n: cluster.inc[n] for n in ("node6", "node7")}
    cluster.start(6)
    cluster.start(7)  # same data dirs: they come back with fresh incarnations, holding nothing
    assert all(cluster.inc[n] > old[n] for n in old)
    await wait_until(all_alive, 30)
    await asyncio.sleep(1.0)
    for a in live():
        v = await obs.view(a)
        assert not v.holders, f"{a} resurrected old holder entries: {v.holders}"
        incs = {u.name: u.inc for u in v.members}
        for n in ("node6", "node7"):
            # At least the incarnation the restart began with: a loaded machine may have
            # had a peer suspect the new process, which refutes by bumping it again (CI
            # saw 3 where the restart began at 2). Never the dead process's incarnation.
            assert incs[n] >= cluster.inc[n] > old[n], (a, n, incs[n], cluster.inc[n], old[n])
