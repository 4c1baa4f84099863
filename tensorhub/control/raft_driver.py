"""The asyncio driver of one Raft voter: ticks, messages, fsync, apply — in etcd's order.

Every input (a timer tick, a Raft message from the transport, a proposal, a read) goes
through one queue into the :class:`~tensorhub.core.raft.RaftCore`. After each input the
driver drains the core's Ready: it persists hard state and entries (fsync, in a worker
thread so the loop keeps serving), *then* hands messages to per-peer senders, *then*
applies committed entries to the :class:`~tensorhub.core.registry.Registry` and releases
linearizable reads. A storage failure stops the voter (fail-stop): it never acts on state
it could not make durable.

Voter ids are their listen addresses ("host:port"), so the bootstrap ``seeds`` list is the
voter set.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core.errors import NoQuorum, TensorHubError
from ..core.messages import Message, RegistryReply, RegistryRequest
from ..core.raft import HardState, ProposalDropped, RaftConfig, RaftCore, RaftMessage, Ready, Role
from ..core.registry import (
    ClientSession,
    Registry,
    RegistryError,
    Result,
    decode_proposal,
    encode_proposal,
)
from ..dataplane.node import Node
from ..dataplane.peer import PeerHandler
from ..io.raft_storage import RaftStorage, StorageError
from .outbox import PeerOutbox, cancel_all

log = logging.getLogger(__name__)

TICK_SECONDS = 0.05
"""One Raft tick. With election_tick=10 an election starts 0.5–1 s after the leader is lost."""
SNAPSHOT_EVERY = 1000
OUTBOX_LIMIT = 4096


@dataclass
class _Waiter:
    fut: asyncio.Future[object]
    index: int = 0
    data: bytes = b""  # the proposal, or the read's context, to re-issue on a new leader


class RaftNode:
    """Runs the version registry's Raft for one voter on top of a :class:`Node`."""

    def __init__(
        self,
        node: Node,
        voters: Sequence[str],
        storage: RaftStorage,
        *,
        config: RaftConfig | None = None,
        tick: float = TICK_SECONDS,
        seed: int | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.node = node
        self.id = node.address
        if self.id not in voters:
            raise ValueError(f"{self.id} is not in the voter set {list(voters)}")
        self.voters = tuple(voters)
        self.storage = storage
        self.tick_seconds = tick
        self.snapshot_every = snapshot_every
        rec = storage.recovered
        rng = random.Random(seed if seed is not None else os.urandom(8))
        self.core = RaftCore(
            self.id,
            self.voters,
            rng,
            config=config or RaftConfig(),
            hard_state=rec.hard_state,
            snapshot=rec.snapshot,
            entries=rec.entries,
        )
        self.registry = Registry.restore(rec.snapshot.data) if rec.snapshot else Registry()
        self.core.log.applied = self.registry.applied
        self._inbox: asyncio.Queue[Callable[[], None]] = asyncio.Queue()
        self._proposals: dict[str, _Waiter] = {}
        self._reads: dict[bytes, _Waiter] = {}
        self._parked_reads: list[_Waiter] = []
        self._outbox = PeerOutbox(node, limit=OUTBOX_LIMIT, backoff=tick, max_backoff=2.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._ids = itertools.count(1)
        self._session = ClientSession(f"{self.id}/{os.urandom(6).hex()}")
        self.failed: BaseException | None = None
        self.on_commit: list[Callable[[str, int], None]] = []
        """Called with (model, version) whenever a version commits (for watchers)."""
        node.control[RaftMessage] = self._on_raft
        node.control[RegistryRequest] = self._on_request

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._ticker()), loop.create_task(self._run())]
        self._inbox.put_nowait(lambda: None)  # re-apply what the log has committed

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks.clear()
        await self._outbox.close()
        self._fail_all(NoQuorum(f"voter {self.id} stopped"))
        self.storage.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            self._inbox.put_nowait(self.core.tick)

    async def _run(self) -> None:
        """The voter's one loop. Anything it cannot do — persist state, write a snapshot,
        or any bug — stops the voter loudly (fail-stop): logged, shown in :meth:`status`,
        and every caller told why, never a silently dead task behind a live-looking
        leader."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                event = await self._inbox.get()
                with contextlib.suppress(ProposalDropped):  # reported by the event
                    event()
                while self.core.has_ready():
                    rd = self.core.ready()
                    if rd.hard_state is not None or rd.entries or rd.snapshot is not None:
                        # (Off the loop: an fsync. A leader's heartbeats, a Ready every
                        # tick with nothing to persist, skip the thread hop.)
                        await loop.run_in_executor(
                            None, self.storage.save, rd.hard_state, rd.entries, rd.snapshot
                        )
                    self._handle(rd)
                    self.core.advance(rd)
                    self._maybe_snapshot()
        except asyncio.CancelledError:
            raise
        except StorageError as e:
            log.error("voter %s stops: %s", self.id, e)
            self._fail_stop(e)
        except Exception as e:
            log.exception("voter %s stops on an unexpected error", self.id)
            self._fail_stop(e)

    def _fail_stop(self, err: BaseException) -> None:
        self.failed = err
        # Callers see NoQuorum (this voter cannot serve; another may), naming the cause.
        self._fail_all(NoQuorum(f"voter {self.id} has stopped: {err}"))
        for t in self._tasks:  # the ticker: nothing drains the inbox any more
            if t is not asyncio.current_task():
                t.cancel()

    def _handle(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.registry = Registry.restore(rd.snapshot.data)
        for m in rd.messages:
            self._send(m)
        for e in rd.committed:
            out = self.registry.apply(e.index, e.data)
            if out is not None:
                self._applied(e.index, e.data, *out)
        for rs in rd.read_states:
            w = self._reads.pop(rs.context, None)
            if w is not None:
                w.index = rs.index
                self._parked_reads.append(w)
        if self._parked_reads:
            ready = [w for w in self._parked_reads if w.index <= self.registry.applied]
            self._parked_reads = [w for w in self._parked_reads if w.index > self.registry.applied]
            for w in ready:
                if not w.fut.done():
                    w.fut.set_result(w.index)
        if rd.soft_state is not None:
            log.info(
                "voter %s: %s (leader %s, term %d)",
                self.id,
                rd.soft_state.role.value,
                rd.soft_state.lead,
                self.core.term,
            )
            if rd.soft_state.lead is not None:
                self._reissue()

    def _reissue(self) -> None:
        """A new leader: requests forwarded to the old one may be lost, so send them again.
        Safe: the registry applies each (session, seq) once and reads are keyed by context."""
        for w in self._proposals.values():
            with contextlib.suppress(ProposalDropped):
                self.core.propose(w.data)
        for ctx in self._reads:
            with contextlib.suppress(ProposalDropped):
                self.core.read_index(ctx)

    def _applied(self, index: int, data: bytes, req: str, result: Result) -> None:
        w = self._proposals.pop(req, None)
        if w is not None and not w.fut.done():
            w.fut.set_result(result)
        if result.committed and result.code == "ok":
            cmd = decode_proposal(data).cmd
            rec = self.registry.version(cmd.model, cmd.version)
            if rec is None or rec.committed_at != index:
                return  # a duplicate of the commit (its first result, replayed): told once
            for cb in self.on_commit:
                cb(cmd.model, cmd.version)

    def _maybe_snapshot(self) -> None:
        applied = self.registry.applied
        if applied - self.core.log.snapshot_index < self.snapshot_every:
            return
        snap = self.core.compact(applied, self.registry.snapshot())
        self.storage.save_snapshot(snap)
        if self.storage.needs_rewrite():
            self.storage.rewrite(self.core.hard_state(), self.core.log.entries)

    def _fail_all(self, err: BaseException) -> None:
        for w in (*self._proposals.values(), *self._reads.values(), *self._parked_reads):
            if not w.fut.done():
                w.fut.set_exception(err)
                w.fut.exception()
        self._proposals.clear()
        self._reads.clear()
        self._parked_reads.clear()

    # -- network -------------------------------------------------------------------------------

    def _on_raft(self, _peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, RaftMessage)
        if msg.to == self.id and msg.frm in self.voters:
            self._inbox.put_nowait(lambda: self.core.step(msg))

    def _send(self, m: RaftMessage) -> None:
        self._outbox.send(m.to, m)

    def _on_request(self, peer: PeerHandler, msg: Message) -> None:
        assert isinstance(msg, RegistryRequest)
        asyncio.get_running_loop().create_task(self._serve_request(peer, msg))

    async def _serve_request(self, peer: PeerHandler, r: RegistryRequest) -> None:
        try:
            if r.op == "propose":
                res = await self.propose_raw(r.data)
                reply = RegistryReply(r.req, res.ok, res.code, res.message, int(res.committed))
            elif r.op == "latest":
                reply = RegistryReply(r.req, True, value=await self.latest(r.model))
            elif r.op == "status":
                c = self.core
                role = "stopped" if self.failed is not None else c.role.value
                reply = RegistryReply(r.req, True, role, c.lead or "", c.term)
            elif r.op == "version":
                await self.read_index()
                rec = self.registry.version(r.model, r.value)
                if rec is None or rec.retired:
                    reply = RegistryReply(
                        r.req, False, "unknown_version", f"{r.model} v{r.value} is not committed"
                    )
                else:
                    reply = RegistryReply(
                        r.req,
                        True,
                        "retained" if rec.retained else "",
                        value=r.value,
                        data=msgspec.msgpack.encode(list(rec.roots())),
                    )
            elif r.op == "publishers":  # who published each shard: a first holder to ask
                await self.read_index()
                rec = self.registry.version(r.model, r.value)
                ok = rec is not None and not rec.retired
                names = list(rec.publishers()) if rec is not None and ok else []
                reply = RegistryReply(r.req, ok, data=msgspec.msgpack.encode(names))
            elif r.op == "versions":
                vs = self.registry.committed_versions(r.model)
                reply = RegistryReply(r.req, True, data=msgspec.msgpack.encode(vs))
            else:
                reply = RegistryReply(r.req, False, "bad_op", f"unknown op {r.op!r}")
        except NoQuorum as e:
            reply = RegistryReply(r.req, False, "no_quorum", str(e))
        except RegistryError as e:  # a malformed command: refuse it now, never retry it
            reply = RegistryReply(r.req, False, "malformed", str(e))
        except Exception as e:  # a bug: answer (the client must not wait), and say it loudly
            log.exception("voter %s: request %s failed", self.id, r.op)
            reply = RegistryReply(r.req, False, "internal", f"{type(e).__name__}: {e}")
        with contextlib.suppress(TensorHubError, OSError):
            await peer.conn.send(reply)

    # -- API -------------------------------------------------------------------------------------

    async def _submit(
        self,
        waiters: dict[Any, _Waiter],
        key: object,
        data: bytes,
        step: Callable[[], None],
        timeout: float,
        what: str,
    ) -> object:
        """Run ``step`` on the core's loop and wait for its waiter (proposal or read).

        If no leader is known yet the request stays pending: it is re-issued as soon as one
        is elected (see ``_reissue``), and fails with NoQuorum only at the deadline."""
        if self.failed is not None:
            raise NoQuorum(f"voter {self.id} has stopped: {self.failed}")
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        waiters[key] = _Waiter(fut, data=data)

        def go() -> None:
            with contextlib.suppress(ProposalDropped):
                step()

        self._inbox.put_nowait(go)
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            waiters.pop(key, None)
            lead = self.core.lead
            why = f"leader {lead}" if lead else "no leader known"
            raise NoQuorum(f"{what} within {timeout}s ({why})") from None

    async def propose_raw(self, data: bytes, timeout: float = 5.0) -> Result:
        """Propose an encoded Proposal; returns its Result once applied here."""
        res = await self._submit(
            self._proposals,
            decode_proposal(data).req,
            data,
            lambda: self.core.propose(data),
            timeout,
            "proposal not committed",
        )
        assert isinstance(res, Result)
        return res

    async def propose(self, cmd: object, timeout: float = 5.0) -> Result:
        p = self._session.proposal(cmd)  # type: ignore[arg-type]
        return await self.propose_raw(encode_proposal(p), timeout)

    async def read_index(self, timeout: float = 5.0) -> int:
        """A linearizable read point: once this returns, the local registry is up to date."""
        ctx = f"{self.id}#r{next(self._ids)}".encode()
        idx = await self._submit(
            self._reads,
            ctx,
            ctx,
            lambda: self.core.read_index(ctx),
            timeout,
            "no quorum confirmed a read",
        )
        assert isinstance(idx, int)
        return idx

    async def latest(self, model: str, timeout: float = 5.0) -> int:
        await self.read_index(timeout)
        return self.registry.latest(model)

    def status(self) -> dict[str, object]:
        return {
            "id": self.id,
            "role": "stopped" if self.failed is not None else self.core.role.value,
            "term": self.core.term,
            "leader": self.core.lead,
            "commit": self.core.log.committed,
            "applied": self.registry.applied,
            "failed": str(self.failed or ""),
        }

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    def hard_state(self) -> HardState:
        return self.core.hard_state()
