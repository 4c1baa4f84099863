"""The Raft voter driver in one process: real transport, real storage, three voters."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tensorhub.control.raft_driver import RaftNode
from tensorhub.core.errors import NoQuorum
from tensorhub.core.registry import PublishShard, Retain
from tensorhub.dataplane.node import Node
from tensorhub.io import raft_storage
from tensorhub.io.raft_storage import RaftStorage, StorageError

from .test_multiprocess import free_ports


def pub(v: int) -> PublishShard:
    return PublishShard("policy", v, 0, 1, v.to_bytes(16, "big"), "trainer")


async def start_voters(tmp: Path, addrs: list[str], which: range) -> list[RaftNode]:
    out = []
    for i in which:
        node = await Node.start(f"v{i}", listen=addrs[i], secret="s")
        raft = RaftNode(node, addrs, RaftStorage.open(tmp / f"v{i}"), seed=i, tick=0.02)
        await raft.start()
        out.append(raft)
    return out


@contextlib.asynccontextmanager
async def voters(tmp: Path) -> AsyncIterator[tuple[list[str], list[RaftNode]]]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    rafts = await start_voters(tmp, addrs, range(3))
    try:
        yield addrs, rafts
    finally:
        for r in rafts:
            await r.stop()
            await r.node.close()


async def test_commit_latest_callback_and_restart_from_disk(tmp_path: Path) -> None:
    committed: list[tuple[str, int]] = []
    async with voters(tmp_path) as (_addrs, rafts):
        for r in rafts:
            r.on_commit.append(lambda m, v: committed.append((m, v)))
        res = await rafts[0].propose(pub(1))
        assert res.ok and res.committed
        assert (await rafts[1].propose(pub(1))).code == "already"  # idempotent retry
        assert (await rafts[2].propose(Retain("policy", 1, "rollout-3"))).ok
        assert await rafts[2].latest("policy") == 1  # linearizable, from any voter
        assert committed.count(("policy", 1)) == 3  # once per voter
        st = rafts[0].status()
        assert st["applied"] == rafts[0].registry.applied and st["failed"] == ""
    # Restart all three from their disks: the registry comes back whole.
    async with voters(tmp_path) as (_addrs, rafts):
        assert await rafts[0].latest("policy") == 1
        assert rafts[0].registry.version("policy", 1) is not None
        assert rafts[0].registry.version("policy", 1).retained == ["rollout-3"]  # type: ignore[union-attr]


async def test_minority_gets_no_quorum_quickly(tmp_path: Path) -> None:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    (alone,) = await start_voters(tmp_path, addrs, range(1))
    try:
        with pytest.raises(NoQuorum):
            await alone.propose(pub(1), timeout=1.0)
        with pytest.raises(NoQuorum):
            await alone.latest("policy", timeout=1.0)
    finally:
        await alone.stop()
        await alone.node.close()


async def test_full_disk_stops_the_voter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with voters(tmp_path) as (_addrs, rafts):
        assert (await rafts[0].propose(pub(1))).ok

        def full(fd: int, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(raft_storage.os, "write", full)
        with pytest.raises((StorageError, NoQuorum)):  # the voter's own disk failed
            await rafts[0].propose(pub(2), timeout=2.0)
        monkeypatch.setattr(raft_storage.os, "write", os.write)
        assert any(r.failed is not None for r in rafts)  # fail-stop, never acting on lost state
