"""Registry access from any node: voters are asked over the transport, with retries.

A non-voter sends :class:`~tensorhub.core.messages.RegistryRequest` s to the voters (the
last one that answered first, then the others), backing off exponentially between rounds,
until the request succeeds or its deadline passes; then it raises :class:`NoQuorum`. Each
proposal carries this client's session (one per process incarnation) and a sequence
number, so a retry after an unknown outcome applies at most once (see
:mod:`tensorhub.core.registry`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core.errors import AuthenticationError, NoQuorum, TensorHubError, TransferError
from ..core.messages import Message, RegistryReply, RegistryRequest
from ..core.registry import ClientSession, Command, Result, encode_proposal
from ..dataplane.node import Node
from ..dataplane.peer import PeerHandler

DEFAULT_DEADLINE = 30.0
ATTEMPT_TIMEOUT = 6.0


@dataclass
class _Call:
    fut: asyncio.Future[RegistryReply]


class RegistryClient:
    def __init__(self, node: Node, voters: Sequence[str] | Callable[[], Sequence[str]]) -> None:
        """``voters``: their addresses, or a function returning them (e.g. from gossip)."""
        self.node = node
        self._voters = voters
        self._ids = itertools.count(1)
        self.session = ClientSession(f"{node.name}/{os.urandom(6).hex()}")
        self._calls: dict[int, _Call] = {}
        self._preferred = 0
        node.control[RegistryReply] = self._on_reply

    @property
    def voters(self) -> list[str]:
        return list(self._voters() if callable(self._voters) else self._voters)

    def _on_reply(self, _peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, RegistryReply)
        call = self._calls.pop(msg.req, None)
        if call is not None and not call.fut.done():
            call.fut.set_result(msg)

    async def _ask(
        self,
        voter: str,
        op: str,
        model: str,
        data: bytes,
        value: int = 0,
        timeout: float = ATTEMPT_TIMEOUT,
    ) -> RegistryReply:
        req = next(self._ids)
        fut: asyncio.Future[RegistryReply] = asyncio.get_running_loop().create_future()
        self._calls[req] = _Call(fut)
        try:
            peer = await asyncio.wait_for(self.node.control_peer(voter), timeout)
            await peer.conn.send(RegistryRequest(req, op, model, data, value))
            # A voter that dies mid-request closes the connection: fail over at once.
            closed: asyncio.Future[Any] = asyncio.ensure_future(asyncio.shield(peer.conn.closed))
            waiting: set[asyncio.Future[Any]] = {fut, closed}
            try:
                done, _ = await asyncio.wait(
                    waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                closed.cancel()
            if fut in done:
                return fut.result()
            if closed in done:
                raise TransferError(f"voter {voter} closed the connection")
            raise asyncio.TimeoutError
        finally:
            self._calls.pop(req, None)

    async def call(
        self,
        op: str,
        model: str = "",
        data: bytes = b"",
        deadline: float = DEFAULT_DEADLINE,
        value: int = 0,
    ) -> RegistryReply:
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        backoff = 0.05
        last: str = "no voter answered"
        while True:
            voters = self.voters
            if not voters:
                last = "no voter known yet"
            self._preferred %= max(len(voters), 1)
            order = voters[self._preferred :] + voters[: self._preferred]
            refused: list[AuthenticationError] = []
            for i, voter in enumerate(order):
                left = end - loop.time()
                if left <= 0:
                    break
                try:
                    reply = await self._ask(
                        voter, op, model, data, value, min(ATTEMPT_TIMEOUT, left)
                    )
                except AuthenticationError as e:
                    refused.append(e)
                    last = f"{voter}: {e}"
                    continue
                except (TensorHubError, OSError, asyncio.TimeoutError) as e:
                    last = f"{voter}: {e or type(e).__name__}"
                    continue
                if reply.code == "no_quorum":
                    last = f"{voter}: {reply.message}"
                    continue
                self._preferred = (self._preferred + i) % len(voters)
                return reply
            if order and len(refused) == len(order):
                # Every voter answered and none shares our secret: waiting will not help.
                raise refused[0]
            if loop.time() + backoff > end:
                raise NoQuorum(f"registry unavailable for {deadline:g}s: {last}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def propose(self, cmd: Command, deadline: float = DEFAULT_DEADLINE) -> Result:
        """Commit ``cmd`` (applied once, however often it is retried)."""
        p = self.session.proposal(cmd)
        reply = await self.call("propose", data=encode_proposal(p), deadline=deadline)
        return Result(reply.ok, reply.code, reply.message, bool(reply.value))

    async def version(
        self, model: str, version: int, deadline: float = DEFAULT_DEADLINE
    ) -> tuple[bytes, ...] | None:
        """Manifest roots (one per shard) of a committed version; None if not committed."""
        reply = await self.call("version", model, deadline=deadline, value=version)
        if not reply.ok:
            return None
        return tuple(msgspec.msgpack.decode(reply.data, type=list[bytes]))

    async def publishers(
        self, model: str, version: int, deadline: float = DEFAULT_DEADLINE
    ) -> tuple[str, ...]:
        """The node that published each shard of a committed version (empty if it is not
        committed, or the voters predate the question)."""
        reply = await self.call("publishers", model, deadline=deadline, value=version)
        if not reply.ok:
            return ()
        return tuple(msgspec.msgpack.decode(reply.data, type=list[str]))

    async def retained(self, model: str, version: int, deadline: float = DEFAULT_DEADLINE) -> bool:
        """Whether a committed version is pinned by someone's retain."""
        reply = await self.call("version", model, deadline=deadline, value=version)
        return reply.ok and reply.code == "retained"

    async def latest(self, model: str, deadline: float = DEFAULT_DEADLINE) -> int:
        reply = await self.call("latest", model, deadline=deadline)
        return reply.value

    async def ask(self, voter: str, op: str, model: str = "") -> RegistryReply:
        """One request to one voter, no retries (status and diagnostics)."""
        return await self._ask(voter, op, model, b"")
