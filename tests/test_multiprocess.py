"""Two real processes on loopback: bit-identical transfer, and a server killed with -9."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorhub.core.errors import TransferError
from tensorhub.core.messages import Cancel
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.store import Replica
from tensorhub.io.tensors import TensorBytes, empty_like_manifest, tensor_digests

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def server() -> Iterator[tuple[subprocess.Popen[str], dict[str, Any]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.serve_proc", "--mib", "64"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    try:
        yield proc, info
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        proc.stdout.close()


async def test_two_processes_bit_identical(
    server: tuple[subprocess.Popen[str], dict[str, Any]],
) -> None:
    _proc, info = server
    node = await Node.start("client", secret="mp-secret")
    try:
        peer = await node.peer(info["address"])
        for model, key in (("dtypes", "digests"), ("big", "big")):
            root = bytes.fromhex(info["roots"][0 if model == "dtypes" else 1])
            m = await peer.get_manifest(model, 1, root)
            into = empty_like_manifest(m)
            await node.fetch(info["address"], model, 1, into, expected_root=root)
            assert tensor_digests(into) == info[key]
    finally:
        await node.close()


async def test_server_killed_mid_transfer(
    server: tuple[subprocess.Popen[str], dict[str, Any]],
) -> None:
    proc, info = server
    node = await Node.start("client", secret="mp-secret")
    try:
        peer = await node.peer(info["address"])
        m = await peer.get_manifest("big", 1)
        into = empty_like_manifest(m)
        replica_task = asyncio.create_task(node.fetch(info["address"], "big", 1, into, window=1))
        start = peer.conn.bytes_received
        while peer.conn.bytes_received - start < (2 << 20):  # a couple of chunks are in
            await asyncio.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(TransferError):
            await asyncio.wait_for(replica_task, 30)
        assert len(node.store) == 0  # nothing half-fetched is held or served
    finally:
        await node.close()


async def test_requests_given_up_are_not_sent_by_a_server_process(
    server: tuple[subprocess.Popen[str], dict[str, Any]],
) -> None:
    """A real server process, asked for all 64 chunks of a model while we read nothing,
    then told 48 of those requests are given up (Cancel), and sent a thousand Cancels for
    requests it never had: it ends each given-up request with one "cancelled" instead of
    its chunk wherever the chunk had not gone out yet (far fewer bytes cross than were
    asked for), ignores the stray ones, and the connection stays in step (the whole
    model, fetched after, is bit-identical)."""
    _proc, info = server
    node = await Node.start("client", secret="mp-secret")
    try:
        peer = await node.peer(info["address"])
        root = bytes.fromhex(info["roots"][1])
        m = await peer.get_manifest("big", 1, root)
        into = empty_like_manifest(m)
        replica = Replica("big", 1, m, TensorBytes.for_destination(m, into))
        for rid in range(1 << 30, (1 << 30) + 1000):  # never issued on this connection
            await peer.conn.send(Cancel(rid))
        peer.conn.pause_reading()
        start = peer.conn.bytes_received
        tasks = [asyncio.create_task(peer.get_chunk(replica, c)) for c in range(m.num_chunks)]
        await asyncio.sleep(0.5)  # every request reaches the server; its buffers fill
        for t in tasks[16:]:
            t.cancel()
        await asyncio.sleep(0.5)  # the Cancels reach it
        peer.conn.resume_reading()
        await asyncio.wait_for(asyncio.gather(*tasks[:16]), 30)
        deadline = asyncio.get_running_loop().time() + 30
        while peer.requests_open:
            assert asyncio.get_running_loop().time() < deadline, "given-up requests never ended"
            await asyncio.sleep(0.01)
        crossed = peer.conn.bytes_received - start
        print(f"gave up 48 of 64 chunks of 1 MiB: {crossed / 2**20:.1f} MiB came")
        assert all(replica.have[c] for c in range(16))
        assert crossed < 48 << 20  # without Cancel all 64 MiB came
        fresh = empty_like_manifest(m)
        await node.fetch(info["address"], "big", 1, fresh, expected_root=root)
        assert tensor_digests(fresh) == info["big"]
    finally:
        await node.close()
