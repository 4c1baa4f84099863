"""One node's asyncio driver: its listener, its connections and what it holds.

Everything that touches the network for a node goes through here, so later layers (Raft,
gossip, the swarm) plug into one place. This first version serves the versions it holds and
fetches whole versions from a named peer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import torch

from .core.layout import DEFAULT_ALIGN, DEFAULT_CHUNK_SIZE
from .core.manifest import Manifest
from .core.messages import Message
from .fetch import DEFAULT_WINDOW, FetchResult, fetch_version
from .io import tcp
from .io.tensors import TensorBytes, build_manifest
from .peer import ControlHandler, PeerHandler
from .store import LocalStore, Replica


def resolve_secret(secret: bytes | str | None) -> bytes:
    """The cluster secret: given, or from ``TENSORHUB_SECRET``; never empty."""
    if secret is None:
        secret = os.environ.get("TENSORHUB_SECRET")
    if not secret:
        raise ValueError("a cluster secret is required (argument or TENSORHUB_SECRET)")
    return secret.encode() if isinstance(secret, str) else bytes(secret)


class Node:
    """A tensorhub peer: serves what it holds, fetches from others."""

    def __init__(self, name: str, secret: bytes) -> None:
        self.name = name
        self._secret = secret
        self.store = LocalStore()
        self._server: tcp.Server | None = None
        self._peers: dict[str, PeerHandler] = {}
        self._dialing: dict[str, asyncio.Future[PeerHandler]] = {}
        self.handlers: set[PeerHandler] = set()
        self.control: dict[type[Message], ControlHandler] = {}
        """Handlers for control-plane messages (Raft, registry requests), by type."""

    @classmethod
    async def start(
        cls, name: str, *, listen: str = "127.0.0.1:0", secret: bytes | str | None = None
    ) -> Node:
        node = cls(name, resolve_secret(secret))
        node._server = await tcp.listen(
            listen, node=name, secret=node._secret, handler_factory=node._handler
        )
        return node

    @property
    def address(self) -> str:
        assert self._server is not None, "node not started"
        return self._server.address

    def _handler(self, conn: tcp.Connection) -> PeerHandler:
        h = PeerHandler(conn, self.store, self.control)
        self.handlers.add(h)
        conn.closed.add_done_callback(lambda _f: self.handlers.discard(h))
        return h

    async def peer(self, addr: str) -> PeerHandler:
        """An open connection to ``addr`` (one per address, dialled on first use)."""
        h = self._peers.get(addr)
        if h is not None and not h.conn.is_closing:
            return h
        pending = self._dialing.get(addr)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[PeerHandler] = asyncio.get_running_loop().create_future()
        self._dialing[addr] = fut
        try:
            conn = await tcp.connect(
                addr, node=self.name, secret=self._secret, handler_factory=self._handler
            )
            handler = conn.handler
            assert isinstance(handler, PeerHandler)
            self._peers[addr] = handler
            fut.set_result(handler)
            return handler
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            del self._dialing[addr]

    def serve(
        self,
        model: str,
        version: int,
        tensors: Mapping[str, torch.Tensor],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        align: int = DEFAULT_ALIGN,
    ) -> Manifest:
        """Hold ``tensors`` as (model, version) and serve them (no copy is made of
        contiguous tensors: they must not change until :meth:`withdraw` returns)."""
        data = TensorBytes.from_state_dict(tensors, chunk_size, align)
        manifest = build_manifest(data)
        replica = Replica(model, version, manifest, data)
        replica.have[:] = b"\x01" * manifest.num_chunks
        self.store.add(replica)
        return manifest

    async def withdraw(self, model: str, version: int) -> None:
        """Stop serving (model, version); returns once no upload reads its memory."""
        replica = self.store.remove(model, version)
        await replica.drained()

    async def fetch(
        self,
        addr: str,
        model: str,
        version: int,
        into: Mapping[str, torch.Tensor],
        *,
        expected_root: bytes | None = None,
        window: int = DEFAULT_WINDOW,
        hold: bool = True,
    ) -> FetchResult:
        """Fetch a whole version from the peer at ``addr``; then (if ``hold``) serve it too."""
        peer = await self.peer(addr)
        replica, result = await fetch_version(
            peer, model, version, into, expected_root=expected_root, window=window
        )
        if hold:
            self.store.add(replica)
        return result

    async def close(self) -> None:
        for h in list(self.handlers):
            await h.aclose()
        if self._server is not None:
            await self._server.close()
