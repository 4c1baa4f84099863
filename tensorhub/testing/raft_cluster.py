"""A deterministic, in-memory Raft cluster for tests: real RaftCores, a simulated network.

One ``random.Random(seed)`` drives every choice (election timeouts, latencies, drops), so a
seed replays a run exactly. The network can drop, cut, isolate, delay, duplicate and reorder
messages; nodes can crash at any point of the Ready cycle and restart from exactly what was
persisted. Invariants are checked online (I1 election safety, I3 state-machine safety,
I4 durability, acknowledged entries in every later leader, I6 version monotonicity) and on
demand (I2 log matching); a violation raises :class:`InvariantViolation`.
"""

from __future__ import annotations

import contextlib
import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import msgspec
import xxhash

from ..core.raft import (
    Entry,
    HardState,
    ProposalDropped,
    RaftConfig,
    RaftCore,
    RaftMessage,
    Ready,
    Role,
    Snapshot,
)
from ..core.registry import Proposal, Registry, Result, decode_proposal, encode_proposal

TICK = 10  # simulated time units per tick; message latency is drawn in these units


class InvariantViolation(AssertionError):
    pass


@dataclass
class MemStorage:
    """What survives a crash: exactly what the Readys asked to persist."""

    hard_state: HardState = field(default_factory=HardState)
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None

    def persist(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snapshot = rd.snapshot
            self.entries = [e for e in self.entries if e.index > rd.snapshot.index]
            if self.entries and self.entries[0].index != rd.snapshot.index + 1:
                self.entries = []
        if rd.entries:
            first = rd.entries[0].index
            self.entries = [e for e in self.entries if e.index < first]
            self.entries.extend(rd.entries)
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state

    def compact(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.entries = [e for e in self.entries if e.index > snap.index]


@dataclass
class SimNode:
    id: str
    core: RaftCore
    storage: MemStorage
    registry: Registry
    alive: bool = True


@dataclass
class Pending:
    """A client request whose outcome is not known yet."""

    node: str
    req: str
    kind: str
    arg: object
    call: int
    result: object = None
    ret: float | None = None
    data: bytes = b""  # a proposal's bytes, to send again (a client's retry)


class Cluster:
    def __init__(
        self,
        n: int = 3,
        seed: int = 0,
        *,
        learners: int = 0,
        config: RaftConfig | None = None,
        latency: tuple[int, int] = (1, 5),
        snapshot_every: int = 0,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.cfg = config or RaftConfig()
        self.voters = tuple(f"n{i}" for i in range(n))
        self.learner_ids = tuple(f"l{i}" for i in range(learners))
        self.now = 0
        self._seq = 0
        self.queue: list[tuple[int, int, RaftMessage]] = []
        self.latency = latency
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.cut: set[tuple[str, str]] = set()
        self.drop_if: Callable[[RaftMessage], bool] | None = None  # scripted scenarios
        self.snapshot_every = snapshot_every
        self.nodes: dict[str, SimNode] = {}
        for nid in (*self.voters, *self.learner_ids):
            self.nodes[nid] = self._boot(nid, MemStorage())
        # invariant state
        self.leaders: dict[int, str] = {}
        self.applied_at: dict[int, tuple[int, bytes]] = {}
        self.committed_ack: dict[int, int] = {}  # index -> term of entries known committed
        self.votes: dict[tuple[str, int], str] = {}
        self.max_term: dict[str, int] = {}
        self.roots: dict[tuple[str, int], bytes] = {}
        self.latest_seen: dict[tuple[str, str], int] = {}
        self.results: dict[str, Result] = {}
        self.pending: dict[str, Pending] = {}
        self.history: list[Pending] = []
        self._req = 0
        self.crash_before_send: set[str] = set()  # crash after persisting, before sending
        self.crash_after_commit: set[str] = set()
        """Crash as soon as a commit is applied, before the messages that tell others of it
        (or that replicate the entries after it) leave: the moment figure 8 is about."""

    # -- lifecycle ---------------------------------------------------------------------------

    def _boot(self, nid: str, st: MemStorage) -> SimNode:
        rng = random.Random(f"{self.seed}/{nid}/{self.now}")
        core = RaftCore(
            nid,
            self.voters,
            rng,
            learners=self.learner_ids,
            config=self.cfg,
            hard_state=st.hard_state,
            snapshot=st.snapshot,
            entries=st.entries,
        )
        reg = Registry.restore(st.snapshot.data) if st.snapshot else Registry()
        core.log.applied = reg.applied
        return SimNode(nid, core, st, reg)

    def crash(self, nid: str) -> None:
        self.nodes[nid].alive = False

    def restart(self, nid: str) -> None:
        old = self.nodes[nid]
        node = self._boot(nid, old.storage)
        if node.core.term < self.max_term.get(nid, 0):
            raise InvariantViolation(
                f"I4: {nid} restarted with term {node.core.term} < "
                f"{self.max_term[nid]} it had persisted"
            )
        self.nodes[nid] = node
        # A restarted node replays its log from its snapshot: monotonicity restarts with it.
        for key in [k for k in self.latest_seen if k[0] == nid]:
            del self.latest_seen[key]

    def alive(self) -> list[str]:
        return [n for n, s in self.nodes.items() if s.alive]

    # -- network -----------------------------------------------------------------------------

    def isolate(self, nid: str) -> None:
        for other in self.nodes:
            if other != nid:
                self.cut.add((nid, other))
                self.cut.add((other, nid))

    def partition(self, *groups: Iterable[str]) -> None:
        gs = [set(g) for g in groups]
        for a in self.nodes:
            for b in self.nodes:
                if a != b and not any(a in g and b in g for g in gs):
                    self.cut.add((a, b))

    def heal(self) -> None:
        self.cut.clear()
        self.drop_rate = self.dup_rate = 0.0

    def _send(self, m: RaftMessage) -> None:
        if (m.frm, m.to) in self.cut or m.to not in self.nodes:
            return
        if self.drop_if is not None and self.drop_if(m):
            return
        if self.drop_rate and self.rng.random() < self.drop_rate:
            return
        copies = 2 if self.dup_rate and self.rng.random() < self.dup_rate else 1
        for _ in range(copies):
            self._seq += 1
            at = self.now + self.rng.randint(*self.latency)
            heapq.heappush(self.queue, (at, self._seq, m))

    # -- driving -----------------------------------------------------------------------------

    def run(self, units: int) -> None:
        for _ in range(units):
            self.step()

    def run_ticks(self, ticks: int) -> None:
        self.run(ticks * TICK)

    def step(self) -> None:
        self.now += 1
        while self.queue and self.queue[0][0] <= self.now:
            _, _, m = heapq.heappop(self.queue)
            node = self.nodes.get(m.to)
            if node is None or not node.alive:
                continue
            # A forwarded proposal may be dropped on the way: its client times out.
            with contextlib.suppress(ProposalDropped):
                node.core.step(m)
            self.process(node)
        if self.now % TICK == 0:
            for node in self.nodes.values():
                if node.alive:
                    node.core.tick()
                    self.process(node)

    def process(self, node: SimNode) -> None:
        core = node.core
        while node.alive and core.has_ready():
            rd = core.ready()
            node.storage.persist(rd)
            if rd.hard_state is not None:
                self._check_hard_state(node.id, rd.hard_state)
            if node.id in self.crash_before_send:
                self.crash_before_send.discard(node.id)
                node.alive = False
                return
            if node.id in self.crash_after_commit and rd.committed:
                self.crash_after_commit.discard(node.id)
                for e in rd.committed:
                    self._apply(node, e)
                node.alive = False
                return
            for m in rd.messages:
                self._send(m)
            if rd.snapshot is not None:
                node.registry = Registry.restore(rd.snapshot.data)
            for e in rd.committed:
                self._apply(node, e)
            for rs in rd.read_states:
                self._complete_read(node, rs.index, rs.context)
            if rd.soft_state is not None and rd.soft_state.role is Role.LEADER:
                self._check_new_leader(node)
            core.advance(rd)
            if (
                self.snapshot_every
                and core.log.applied - core.log.snapshot_index >= self.snapshot_every
            ):
                snap = core.compact(core.log.applied, node.registry.snapshot())
                node.storage.compact(snap)

    def trace_hash(self) -> str:
        """A digest of the client history and every node's log and hard state."""
        h = xxhash.xxh3_128()
        for p in self.history:
            h.update(repr((p.node, p.req, p.kind, p.arg, p.call, p.result, p.ret)).encode())
        for nid, s in self.nodes.items():
            h.update(
                repr(
                    (
                        nid,
                        s.alive,
                        s.core.hard_state(),
                        s.core.log.entries,
                        s.core.log.snapshot_index,
                    )
                ).encode()
            )
        return str(h.hexdigest())

    # -- invariants ----------------------------------------------------------------------------

    def _check_hard_state(self, nid: str, hs: HardState) -> None:
        if hs.term < self.max_term.get(nid, 0):
            raise InvariantViolation(
                f"I4: {nid} persisted term {hs.term} after {self.max_term[nid]}"
            )
        self.max_term[nid] = hs.term
        if hs.vote is not None:
            prev = self.votes.setdefault((nid, hs.term), hs.vote)
            if prev != hs.vote:
                raise InvariantViolation(
                    f"I4: {nid} voted for {prev} and {hs.vote} in term {hs.term}"
                )

    def _check_new_leader(self, node: SimNode) -> None:
        term = node.core.term
        prev = self.leaders.setdefault(term, node.id)
        if prev != node.id:
            raise InvariantViolation(f"I1: two leaders in term {term}: {prev} and {node.id}")
        log = node.core.log
        for index, t in self.committed_ack.items():
            if index > log.snapshot_index and log.term(index) != t:
                raise InvariantViolation(
                    f"I3: new leader {node.id} (term {term}) lacks committed entry {index}/{t}"
                )

    def _apply(self, node: SimNode, e: Entry) -> None:
        seen = self.applied_at.setdefault(e.index, (e.term, e.data))
        if seen != (e.term, e.data):
            raise InvariantViolation(f"I3: {node.id} applied {e.index}/{e.term}, others {seen[0]}")
        self.committed_ack[e.index] = e.term
        out = node.registry.apply(e.index, e.data)
        if out is None:
            return
        req, result = out
        for model, rec in node.registry.models.items():
            key = (node.id, model)
            if rec.latest < self.latest_seen.get(key, 0):
                raise InvariantViolation(f"I6: {node.id} latest {model} went backwards")
            self.latest_seen[key] = rec.latest
            for v, vr in rec.versions.items():
                if vr.committed:
                    root = self.roots.setdefault((model, v), vr.roots()[0])
                    if root != vr.roots()[0]:
                        raise InvariantViolation(f"I6: {model} v{v} has two roots")
        p = self.pending.get(req)
        if p is not None and p.node == node.id and p.ret is None:
            # "already": this exact shard was published before (and may be committed).
            p.result = "committed" if result.committed and result.code == "ok" else result.code
            p.ret = self.now
            del self.pending[req]

    def check_log_matching(self) -> None:
        """I2: the same (index, term) in two logs implies identical prefixes up to it."""
        logs = {n: {e.index: e for e in s.core.log.entries} for n, s in self.nodes.items()}
        names = sorted(logs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                la, lb = logs[a], logs[b]
                common = sorted(set(la) & set(lb), reverse=True)
                matched = False
                for idx in common:
                    if la[idx].term == lb[idx].term:
                        matched = True
                    if matched and la[idx] != lb[idx]:
                        raise InvariantViolation(f"I2: {a} and {b} differ at {idx} below a match")

    # -- clients ---------------------------------------------------------------------------------

    def leader(self) -> str | None:
        best = None
        for n, s in self.nodes.items():
            if (
                s.alive
                and s.core.role is Role.LEADER
                and (best is None or s.core.term > self.nodes[best].core.term)
            ):
                best = n
        return best

    def propose(self, nid: str, cmd: object, kind: str = "publish") -> Pending | None:
        self._req += 1
        req = f"{nid}#{self._req}"
        node = self.nodes[nid]
        data = encode_proposal(Proposal(req, cmd, "sim-client", self._req))  # type: ignore[arg-type]
        p = Pending(nid, req, kind, getattr(cmd, "version", None), self.now, data=data)
        try:
            node.core.propose(data)
        except ProposalDropped:
            return None
        self.pending[req] = p
        self.history.append(p)
        self.process(node)
        return p

    def retry(self, p: Pending, nid: str) -> bool:
        """The client sends ``p`` again, to ``nid`` (it did not hear back, or a message
        was duplicated): the same request id, so it must apply at most once."""
        node = self.nodes[nid]
        if not node.alive:
            return False
        try:
            node.core.propose(p.data)
        except ProposalDropped:
            return False
        if p.ret is None:
            p.node = nid
            self.pending[p.req] = p
        self.process(node)
        return True

    def check_applied_once(self) -> None:
        """I7: each node's registry is what applying every request once (its first copy in
        the log) gives: a duplicated proposal never applies twice."""
        for n, s in self.nodes.items():
            upto = s.registry.applied
            if not s.alive or any(i not in self.applied_at for i in range(1, upto + 1)):
                continue
            want, seen = Registry(), set()
            for i in range(1, upto + 1):
                data = self.applied_at[i][1]
                if data:
                    prop = decode_proposal(data)
                    if (prop.client, prop.seq) in seen:
                        data = b""  # a duplicate: applies nothing
                    else:
                        seen.add((prop.client, prop.seq))
                        data = encode_proposal(msgspec.structs.replace(prop, seq=0))
                want.apply(i, data)
            got, exp = msgspec.to_builtins(s.registry.models), msgspec.to_builtins(want.models)
            if got != exp:
                raise InvariantViolation(f"I7: {n} applied a duplicated request: {got} != {exp}")

    def read(self, nid: str, model: str) -> Pending | None:
        self._req += 1
        ctx = f"{nid}#{self._req}".encode()
        node = self.nodes[nid]
        p = Pending(nid, ctx.decode(), "read", model, self.now)
        try:
            node.core.read_index(ctx)
        except ProposalDropped:
            return None
        self.pending[p.req] = p
        self.history.append(p)
        self.process(node)
        return p

    def _complete_read(self, node: SimNode, index: int, ctx: bytes) -> None:
        p = self.pending.get(ctx.decode())
        if p is None or p.node != node.id:
            return
        p.arg = (p.arg, index)
        if node.core.log.applied >= index or node.registry.applied >= index:
            self._finish_read(node, p)

    def _finish_read(self, node: SimNode, p: Pending) -> None:
        assert isinstance(p.arg, tuple)
        p.result = node.registry.latest(str(p.arg[0]))
        p.ret = self.now
        del self.pending[p.req]

    def finish_reads(self) -> None:
        """Complete reads whose read index has since been applied on their node."""
        for p in list(self.pending.values()):
            if p.kind == "read" and isinstance(p.arg, tuple):
                node = self.nodes[p.node]
                if node.alive and node.registry.applied >= p.arg[1]:
                    self._finish_read(node, p)

    def lose_pending_of(self, nid: str) -> None:
        """A crashed node's clients never hear back: their outcomes stay unknown."""
        for p in list(self.pending.values()):
            if p.node == nid:
                del self.pending[p.req]
