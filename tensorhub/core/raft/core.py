"""RaftCore: the whole protocol as a deterministic state machine.

Inputs: :meth:`RaftCore.tick`, :meth:`RaftCore.step` (a message from a peer),
:meth:`RaftCore.propose`, :meth:`RaftCore.read_index`, :meth:`RaftCore.transfer_leader`,
:meth:`RaftCore.compact`. Output: :meth:`RaftCore.ready`, applied by the caller in etcd's
order — persist hard state, snapshot and entries (fsync), *then* send the messages, then
apply the committed entries — and acknowledged with :meth:`RaftCore.advance`.

Features: randomized election timeouts, PreVote and CheckQuorum (no disruption by
partitioned or rejoining nodes), a no-op entry on election, commitment only of entries of
the leader's term (figure 8), fast log backtracking, pipelined replication with flow
control, ReadIndex reads, snapshots and InstallSnapshot, non-voting learners, and leader
transfer. Membership is fixed at bootstrap (see docs/architecture.md for replacing a voter).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import msgspec

from ..errors import TensorHubError
from .log import RaftLog
from .progress import Progress, PState
from .types import Entry, HardState, MsgType, RaftMessage, ReadState, Snapshot

CAMPAIGN_TRANSFER = b"transfer"


class ProposalDropped(TensorHubError):
    """The proposal was not appended (no leader known, or leadership is being transferred)."""


class RandomLike(Protocol):
    def randrange(self, start: int, stop: int) -> int: ...


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True)
class RaftConfig:
    election_tick: int = 10
    """Ticks without hearing from a leader before campaigning (randomized in [n, 2n))."""
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_entries_per_msg: int = 64
    max_bytes_per_msg: int = 1 << 20
    """An append carries entries up to this many data bytes (at least one entry), as
    etcd's MaxSizePerMsg: a batch of large commands is cut, not sent as one huge frame."""
    max_inflight: int = 64


@dataclass(frozen=True)
class SoftState:
    lead: str | None
    role: Role


@dataclass(frozen=True)
class Ready:
    """Everything the driver must do, in this order: persist, send, apply."""

    hard_state: HardState | None
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
    messages: tuple[RaftMessage, ...]
    committed: tuple[Entry, ...]
    read_states: tuple[ReadState, ...]
    soft_state: SoftState | None

    def empty(self) -> bool:
        return not (
            self.hard_state
            or self.snapshot
            or self.entries
            or self.messages
            or self.committed
            or self.read_states
            or self.soft_state
        )


@dataclass
class _ReadRequest:
    index: int
    frm: str
    acks: set[str] = field(default_factory=set)


class RaftCore:
    def __init__(
        self,
        node_id: str,
        voters: Iterable[str],
        rng: RandomLike,
        *,
        learners: Iterable[str] = (),
        config: RaftConfig = RaftConfig(),
        hard_state: HardState | None = None,
        snapshot: Snapshot | None = None,
        entries: Iterable[Entry] = (),
        applied: int | None = None,
    ) -> None:
        self.id = node_id
        self.cfg = config
        self._rng = rng
        self.log = RaftLog(snapshot, list(entries))
        if snapshot is not None:
            voters, learners = snapshot.voters, snapshot.learners
        self.voters = tuple(sorted(set(voters)))
        self.learners = tuple(sorted(set(learners) - set(self.voters)))
        if not self.voters:
            raise ValueError("a Raft group needs at least one voter")
        hs = hard_state or HardState()
        self.term = hs.term
        self.vote = hs.vote
        self.log.commit_to(min(hs.commit, self.log.last_index()))
        if applied is not None:
            self.log.applied = max(applied, self.log.snapshot_index)
        self.role = Role.FOLLOWER
        self.lead: str | None = None
        self.lead_transferee: str | None = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self.cfg.election_tick
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.msgs: list[RaftMessage] = []
        self.read_states: list[ReadState] = []
        self._reads: dict[bytes, _ReadRequest] = {}
        self._read_queue: list[bytes] = []
        self._pending_reads: list[RaftMessage] = []  # until an entry of our term commits
        self._prev_hs = hs
        self._prev_soft = SoftState(None, Role.FOLLOWER)
        self._snapshot = snapshot
        self.become_follower(self.term, None)

    # -- roles -------------------------------------------------------------------------------

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def promotable(self) -> bool:
        return self.id in self.voters

    def _reset(self, term: int) -> None:
        if self.term != term:
            self.term = term
            self.vote = None
        self.lead = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self._rng.randrange(
            self.cfg.election_tick, 2 * self.cfg.election_tick
        )
        self.lead_transferee = None
        self.votes = {}
        self.progress = {}
        self._reads, self._read_queue = {}, []
        self._pending_reads = []

    def become_follower(self, term: int, lead: str | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.lead = lead

    def become_pre_candidate(self) -> None:
        # Pre-candidates change neither term nor vote: a partitioned node cannot inflate terms.
        self.role = Role.PRE_CANDIDATE
        self.votes = {}
        self.lead = None

    def become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.lead = self.id
        last = self.log.last_index()
        for p in (*self.voters, *self.learners):
            pr = Progress(last + 1, self.cfg.max_inflight, learner=p in self.learners)
            if p == self.id:
                pr.match = last
                pr.recent_active = True
            self.progress[p] = pr
        # The no-op: lets the leader commit (and so serve ReadIndex) in its own term.
        self._append([Entry(self.term, 0)])

    # -- inputs ------------------------------------------------------------------------------

    def tick(self) -> None:
        if self.role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self.election_elapsed += 1
            if self.promotable and self.election_elapsed >= self.randomized_timeout:
                self.election_elapsed = 0
                self._hup(transfer=False)

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self.become_follower(self.term, None)
                return
            self.lead_transferee = None  # a transfer that did not finish in time is abandoned
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def campaign(self) -> None:
        """Start an election now (tests and operators; normally ticks do this)."""
        self._hup(transfer=False)

    def propose(self, data: bytes) -> None:
        """Append ``data`` (forwarded to the leader from a follower); raises ProposalDropped."""
        if not data:
            raise ValueError("empty proposals are reserved for the leader's no-op")
        self.step(RaftMessage(MsgType.PROP, self.id, self.id, entries=(Entry(0, 0, data),)))

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point; a ReadState with ``context`` comes in a Ready."""
        self.step(
            RaftMessage(MsgType.READ_INDEX, self.id, self.id, entries=(Entry(0, 0, context),))
        )

    def transfer_leader(self, to: str) -> None:
        self.step(RaftMessage(MsgType.TRANSFER_LEADER, to, self.id))

    def step(self, m: RaftMessage) -> None:
        if m.term == 0:
            pass  # local or forwarded request (PROP, READ_INDEX, TRANSFER_LEADER)
        elif m.term > self.term:
            if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
                force = m.context == CAMPAIGN_TRANSFER
                in_lease = (
                    self.cfg.check_quorum
                    and self.lead is not None
                    and self.election_elapsed < self.cfg.election_tick
                )
                if not force and in_lease:
                    return  # we heard from a live leader recently: do not be disrupted
            if m.type == MsgType.PRE_VOTE or (m.type == MsgType.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change our term
            elif m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
                self.become_follower(m.term, m.frm)
            else:
                self.become_follower(m.term, None)
        elif m.term < self.term:
            if (self.cfg.check_quorum or self.cfg.pre_vote) and m.type in (
                MsgType.HEARTBEAT,
                MsgType.APP,
            ):
                # A stale leader: answer so it learns our term and steps down.
                self._send(RaftMessage(MsgType.APP_RESP, self.id, m.frm))
            elif m.type == MsgType.PRE_VOTE:
                self._send(RaftMessage(MsgType.PRE_VOTE_RESP, self.id, m.frm, reject=True))
            return

        if m.type in (MsgType.VOTE, MsgType.PRE_VOTE):
            self._handle_vote(m)
        elif self.role is Role.LEADER:
            self._step_leader(m)
        elif self.role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    # -- elections ---------------------------------------------------------------------------

    def _hup(self, transfer: bool) -> None:
        if self.role is Role.LEADER or not self.promotable:
            return
        if self.cfg.pre_vote and not transfer:
            self._campaign(pre=True, transfer=False)
        else:
            self._campaign(pre=False, transfer=transfer)

    def _campaign(self, pre: bool, transfer: bool) -> None:
        if pre:
            self.become_pre_candidate()
            vote_type, term = MsgType.PRE_VOTE, self.term + 1
        else:
            self.become_candidate()
            vote_type, term = MsgType.VOTE, self.term
        if self._poll(self.id, True) == "won":
            if pre:
                self._campaign(pre=False, transfer=False)
            else:
                self.become_leader()
            return
        ctx = CAMPAIGN_TRANSFER if transfer else b""
        for v in self.voters:
            if v != self.id:
                self._send(
                    RaftMessage(
                        vote_type,
                        self.id,
                        v,
                        term=term,
                        index=self.log.last_index(),
                        log_term=self.log.last_term(),
                        context=ctx,
                    ),
                    term=term,
                )

    def _poll(self, frm: str, granted: bool) -> str:
        self.votes.setdefault(frm, granted)
        yes = sum(1 for v in self.voters if self.votes.get(v) is True)
        no = sum(1 for v in self.voters if self.votes.get(v) is False)
        if yes >= self.quorum:
            return "won"
        if no >= self.quorum or yes + (len(self.voters) - yes - no) < self.quorum:
            return "lost"
        return "pending"

    def _handle_vote(self, m: RaftMessage) -> None:
        resp = MsgType.VOTE_RESP if m.type == MsgType.VOTE else MsgType.PRE_VOTE_RESP
        can_vote = (
            self.vote == m.frm
            or (self.vote is None and self.lead is None)
            or (m.type == MsgType.PRE_VOTE and m.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # Granted responses carry the candidate's term (a pre-vote's future term).
            self._send(RaftMessage(resp, self.id, m.frm), term=m.term)
            if m.type == MsgType.VOTE:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(RaftMessage(resp, self.id, m.frm, reject=True))

    def _step_candidate(self, m: RaftMessage) -> None:
        my_resp = MsgType.PRE_VOTE_RESP if self.role is Role.PRE_CANDIDATE else MsgType.VOTE_RESP
        if m.type == MsgType.PROP:
            raise ProposalDropped(f"{self.id}: no leader (election in progress)")
        if m.type in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
            self.become_follower(m.term, m.frm)
            self._step_follower(m)
        elif m.type == my_resp:
            result = self._poll(m.frm, not m.reject)
            if result == "won":
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign(pre=False, transfer=False)
                else:
                    self.become_leader()
                    self._bcast_append()
            elif result == "lost":
                self.become_follower(self.term, None)
        elif m.type == MsgType.READ_INDEX:
            raise ProposalDropped(f"{self.id}: no leader to serve a read")

    # -- follower ----------------------------------------------------------------------------

    def _step_follower(self, m: RaftMessage) -> None:
        t = m.type
        if t in (MsgType.PROP, MsgType.READ_INDEX, MsgType.TRANSFER_LEADER):
            if self.lead is None:
                raise ProposalDropped(f"{self.id}: no leader known")
            self._send(
                RaftMessage(
                    t,
                    m.frm if t == MsgType.TRANSFER_LEADER else self.id,
                    self.lead,
                    entries=m.entries,
                ),
                term=0,
            )
        elif t in (MsgType.APP, MsgType.HEARTBEAT, MsgType.SNAP):
            self.election_elapsed = 0
            self.lead = m.frm
            if t == MsgType.APP:
                self._handle_append(m)
            elif t == MsgType.HEARTBEAT:
                self.log.commit_to(min(m.commit, self.log.last_index()))
                self._send(RaftMessage(MsgType.HEARTBEAT_RESP, self.id, m.frm, context=m.context))
            else:
                self._handle_snapshot(m)
        elif t == MsgType.TIMEOUT_NOW:
            self._hup(transfer=True)
        elif t == MsgType.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.entries[0].data))

    def _handle_append(self, m: RaftMessage) -> None:
        if m.index < self.log.committed:
            self._send(RaftMessage(MsgType.APP_RESP, self.id, m.frm, index=self.log.committed))
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            self._send(RaftMessage(MsgType.APP_RESP, self.id, m.frm, index=last_new))
            return
        hint = min(m.index, self.log.last_index())
        hint, hint_term = self.log.find_conflict_by_term(hint, m.log_term)
        self._send(
            RaftMessage(
                MsgType.APP_RESP,
                self.id,
                m.frm,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=hint_term,
            )
        )

    def _handle_snapshot(self, m: RaftMessage) -> None:
        s = m.snapshot
        assert s is not None
        if self._restore(s):
            self._send(RaftMessage(MsgType.APP_RESP, self.id, m.frm, index=self.log.last_index()))
        else:
            self._send(RaftMessage(MsgType.APP_RESP, self.id, m.frm, index=self.log.committed))

    def _restore(self, s: Snapshot) -> bool:
        if s.index <= self.log.committed:
            return False
        if self.log.match_term(s.index, s.term):
            self.log.commit_to(s.index)  # we have it all already: just fast-forward
            return False
        self.log.restore(s)
        self._snapshot = s
        self.voters, self.learners = tuple(s.voters), tuple(s.learners)
        return True

    # -- leader ------------------------------------------------------------------------------

    def _step_leader(self, m: RaftMessage) -> None:
        t = m.type
        if t == MsgType.PROP:
            if self.lead_transferee is not None:
                raise ProposalDropped(f"{self.id}: leadership transfer to {self.lead_transferee}")
            self._append([Entry(self.term, 0, e.data) for e in m.entries])
            self._bcast_append()
            return
        if t == MsgType.READ_INDEX:
            if self.log.term(self.log.committed) != self.term:
                self._pending_reads.append(m)  # served once our no-op commits
                return
            self._serve_read(m)
            return
        if t == MsgType.TRANSFER_LEADER:
            self._transfer(m.frm)
            return
        pr = self.progress.get(m.frm)
        if pr is None:
            return
        if t == MsgType.APP_RESP:
            pr.recent_active = True
            if m.reject:
                hint = m.reject_hint
                if m.log_term > 0:
                    hint, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
                if pr.maybe_decr_to(m.index, hint):
                    if pr.state is PState.REPLICATE:
                        pr.become_probe()
                    self._send_append(m.frm)
                return
            old_paused = pr.is_paused()
            if pr.maybe_update(m.index):
                if pr.state is PState.PROBE:
                    pr.become_replicate()
                elif pr.state is PState.SNAPSHOT and pr.match >= pr.pending_snapshot:
                    pr.become_probe()
                    pr.become_replicate()
                elif pr.state is PState.REPLICATE:
                    pr.free_to(m.index)
                if self._maybe_commit():
                    self._bcast_append()
                elif old_paused:
                    self._send_append(m.frm)
                while pr.state is PState.REPLICATE and self._send_append(m.frm, only_entries=True):
                    pass
                if m.frm == self.lead_transferee and pr.match == self.log.last_index():
                    self._send(RaftMessage(MsgType.TIMEOUT_NOW, self.id, m.frm))
        elif t == MsgType.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state is PState.REPLICATE and pr.is_paused():
                # A full window of appends it never answered (lost while it was down, or
                # dropped on the way): free one so an append goes out and its answer
                # (an ack, or a rejection that sends us back to probing) gets us moving.
                # etcd does the same (Inflights.FreeFirstOne on MsgHeartbeatResp).
                pr.free_first_one()
            if pr.state is PState.SNAPSHOT:
                pr.become_probe()  # the snapshot may be lost: probe again (resends it if needed)
            if pr.match < self.log.last_index():
                self._send_append(m.frm)
            if m.context and m.context in self._reads:
                self._ack_read(m.frm, m.context)

    def _transfer(self, to: str) -> None:
        if to == self.id or to not in self.voters:
            return
        if self.lead_transferee == to:
            return
        self.lead_transferee = to
        self.election_elapsed = 0
        if self.progress[to].match == self.log.last_index():
            self._send(RaftMessage(MsgType.TIMEOUT_NOW, self.id, to))
        else:
            self._send_append(to)

    def _append(self, ents: list[Entry]) -> None:
        last = self.log.last_index()
        ents = [Entry(self.term, last + 1 + i, e.data) for i, e in enumerate(ents)]
        self.log.append(ents)
        self.progress[self.id].maybe_update(self.log.last_index())
        self._maybe_commit()

    def _maybe_commit(self) -> bool:
        matches = sorted((self.progress[v].match for v in self.voters), reverse=True)
        committed = self.log.maybe_commit(matches[self.quorum - 1], self.term)
        if committed and self._pending_reads and self.log.term(self.log.committed) == self.term:
            pending, self._pending_reads = self._pending_reads, []
            for m in pending:
                self._serve_read(m)
        return committed

    def _send_append(self, to: str, only_entries: bool = False) -> bool:
        """Send what ``to`` needs next; returns whether entries (or a snapshot) went out."""
        pr = self.progress[to]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        if prev_term is None or pr.next < self.log.first_index():
            snap = self._snapshot
            if snap is None:
                return False
            pr.become_snapshot(snap.index)
            self._send(RaftMessage(MsgType.SNAP, self.id, to, snapshot=snap))
            return True
        ents = self.log.slice(
            pr.next, min(self.log.last_index() + 1, pr.next + self.cfg.max_entries_per_msg)
        )
        size = 0
        for i, e in enumerate(ents):
            size += len(e.data)
            if size > self.cfg.max_bytes_per_msg and i > 0:
                ents = ents[:i]
                break
        if only_entries and not ents:
            return False
        self._send(
            RaftMessage(
                MsgType.APP,
                self.id,
                to,
                index=prev,
                log_term=prev_term,
                entries=tuple(ents),
                commit=self.log.committed,
            )
        )
        if ents:
            pr.sent(ents[-1].index)
        return bool(ents)

    def _bcast_append(self) -> None:
        for p in self.progress:
            if p != self.id:
                self._send_append(p)

    def _bcast_heartbeat(self, context: bytes = b"") -> None:
        ctx = context or (self._read_queue[-1] if self._read_queue else b"")
        for p, pr in self.progress.items():
            if p != self.id:
                self._send(
                    RaftMessage(
                        MsgType.HEARTBEAT,
                        self.id,
                        p,
                        commit=min(pr.match, self.log.committed),
                        context=ctx,
                    )
                )

    def _quorum_active(self) -> bool:
        active = 0
        for v in self.voters:
            pr = self.progress[v]
            if v == self.id or pr.recent_active:
                active += 1
            pr.recent_active = False
        return active >= self.quorum

    # -- ReadIndex ---------------------------------------------------------------------------

    def _serve_read(self, m: RaftMessage) -> None:
        ctx = m.entries[0].data
        if len(self.voters) == 1:
            self._release_read(m.frm, self.log.committed, ctx)
            return
        if ctx in self._reads:
            return
        self._reads[ctx] = _ReadRequest(self.log.committed, m.frm, {self.id})
        self._read_queue.append(ctx)
        self._bcast_heartbeat(ctx)

    def _ack_read(self, frm: str, ctx: bytes) -> None:
        req = self._reads[ctx]
        if frm in self.voters:
            req.acks.add(frm)
        if len(req.acks & set(self.voters)) < self.quorum:
            return
        # A quorum confirmed our leadership at this point: release it and every earlier read.
        upto = self._read_queue.index(ctx) + 1
        for c in self._read_queue[:upto]:
            r = self._reads.pop(c)
            self._release_read(r.frm, r.index, c)
        del self._read_queue[:upto]

    def _release_read(self, frm: str, index: int, ctx: bytes) -> None:
        if frm == self.id:
            self.read_states.append(ReadState(index, ctx))
        else:
            self._send(
                RaftMessage(
                    MsgType.READ_INDEX_RESP, self.id, frm, index=index, entries=(Entry(0, 0, ctx),)
                )
            )

    # -- snapshots ---------------------------------------------------------------------------

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Record the state machine's snapshot at ``index`` (≤ applied) and drop the log
        before it. The caller persists the snapshot before calling this."""
        term = self.log.term(index)
        if term is None:
            raise ValueError(f"cannot snapshot at {index}: not in the log")
        snap = Snapshot(index, term, data, self.voters, self.learners)
        self.log.compact(index, term)
        self._snapshot = snap
        return snap

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    # -- output ------------------------------------------------------------------------------

    def _send(self, m: RaftMessage, term: int | None = None) -> None:
        if term is None:
            # Forwarded requests (PROP, READ_INDEX, TRANSFER_LEADER) travel without a term.
            term = (
                0
                if m.type in (MsgType.PROP, MsgType.READ_INDEX, MsgType.TRANSFER_LEADER)
                else self.term
            )
        self.msgs.append(msgspec.structs.replace(m, term=term))

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def soft_state(self) -> SoftState:
        return SoftState(self.lead, self.role)

    def has_ready(self) -> bool:
        return (
            bool(self.msgs or self.read_states or self.log.unstable() or self.log.pending_snapshot)
            or self.hard_state() != self._prev_hs
            or self.soft_state() != self._prev_soft
            or bool(self.log.next_committed())
        )

    def ready(self) -> Ready:
        hs = self.hard_state()
        soft = self.soft_state()
        return Ready(
            hard_state=hs if hs != self._prev_hs else None,
            snapshot=self.log.pending_snapshot,
            entries=tuple(self.log.unstable()),
            messages=tuple(self.msgs),
            committed=tuple(self.log.next_committed()),
            read_states=tuple(self.read_states),
            soft_state=soft if soft != self._prev_soft else None,
        )

    def advance(self, rd: Ready) -> None:
        """The driver persisted, sent and applied everything in ``rd``."""
        if rd.hard_state is not None:
            self._prev_hs = rd.hard_state
        if rd.soft_state is not None:
            self._prev_soft = rd.soft_state
        if rd.snapshot is not None:
            self.log.pending_snapshot = None
            self.log.applied = max(self.log.applied, rd.snapshot.index)
        if rd.entries:
            last = rd.entries[-1]
            if self.log.match_term(last.index, last.term):
                self.log.stabled = max(self.log.stabled, last.index)
        if rd.committed:
            self.log.applied = rd.committed[-1].index
        del self.msgs[: len(rd.messages)]
        del self.read_states[: len(rd.read_states)]
