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
from tensorhub.dataplane.node import Node
from tensorhub.io.tensors import empty_like_manifest, tensor_digests

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
