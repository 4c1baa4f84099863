"""GossipCore: one node's membership and state dissemination, driven by ticks.

Every ``round_ticks`` ticks (one protocol period) a node: finishes its last probe (a target
that answered neither directly nor through ``indirect_checks`` helpers becomes SUSPECT),
probes the next member of a shuffled round-robin order, starts one Scuttlebutt sync with a
random live member, and now and then runs a full membership push-pull (with a live member,
or with a dead member or seed to rediscover it after a partition). Membership updates ride
on probe messages, each retransmitted ``retransmit_mult × ⌈log10(n+1)⌉`` times.

Lifeguard: a node's *awareness* score rises when its own probes fail without the nacks
that would show the network is fine, and when it has to refute a suspicion about itself;
its probe timeout scales with the score, so a slow or overloaded node accuses others less.

Outputs go to :attr:`GossipCore.outbox` as ``(address, message)``; the driver sends them.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..messages import Message
from .holders import HolderView
from .membership import Member, MemberTable, Status, SuspicionTimes
from .messages import (
    GAck,
    GDelta,
    GGossip,
    GNack,
    GPing,
    GPingReq,
    GPushPull,
    GSyn,
    GSynAck,
    Update,
)
from .state import Change, ScuttlebuttState

EVENTS_KEPT = 4096


class RandomLike(Protocol):
    def random(self) -> float: ...
    def randrange(self, start: int, stop: int) -> int: ...
    def shuffle(self, x: list[str]) -> None: ...
    def sample(self, population: list[str], k: int) -> list[str]: ...


@dataclass(frozen=True)
class GossipConfig:
    """Times are in ticks; a tick is about one network latency (the driver uses 20 ms)."""

    round_ticks: int = 10
    """One protocol period: a probe, a state sync, a gossip fan-out."""
    ack_ticks: int = 3
    """Wait this long for a direct ack before asking helpers (a round trip plus slack)."""
    gossip_fanout: int = 3
    indirect_checks: int = 3
    suspicion_mult: int = 4
    suspicion_max_mult: int = 6
    retransmit_mult: int = 4
    max_updates: int = 16
    sync_fanout: int = 2
    """State syncs started per period. Two, not one: a sync needs four messages to get
    through, and under 30 % loss one per period left a long convergence tail."""
    push_pull_rounds: int = 30
    rejoin_rounds: int = 10
    reap_rounds: int = 60
    tombstone_rounds: int = 100
    max_awareness: int = 8
    buckets: int = 64


@dataclass
class _Probe:
    seq: int
    target: str
    start: int
    acked: bool = False
    indirect: bool = False
    nacks: int = 0


class GossipCore:
    def __init__(
        self,
        name: str,
        addr: str,
        locality: str,
        rng: RandomLike,
        *,
        config: GossipConfig | None = None,
        incarnation: int = 0,
        generation: int = 0,
        seeds: Iterable[str] = (),
    ) -> None:
        self.cfg = config or GossipConfig()
        self.rng = rng
        self.now = 0
        self.me = Member(name, addr, locality, incarnation, Status.ALIVE, generation=generation)
        self.members = MemberTable()
        self.members[name] = self.me
        self.dead_memory: dict[str, Member] = {}  # reaped members: refuse their stale news
        self.seeds = [s for s in seeds if s != addr]
        self.state = ScuttlebuttState(name, generation, self.cfg.buckets)
        self.holders = HolderView()
        self.outbox: list[tuple[str, Message]] = []
        self.awareness = 0
        self._seq = 0
        self._probe: _Probe | None = None
        self._order: list[str] = []
        self._relays: dict[
            int, tuple[str, str, int, int]
        ] = {}  # seq → (origin addr, origin, their seq, deadline)
        self._broadcasts: dict[str, tuple[Update, int]] = {}
        self._rounds = 0
        self.events: deque[tuple[int, str, Status]] = deque(maxlen=EVENTS_KEPT)
        """(tick, member, new status), the latest ones: for tests and tools."""
        self._status_changed: set[str] = set()
        self._alive_cache: list[str] | None = None
        self._suspects: set[str] = set()
        self._dead_set: set[str] = set()
        self._next_probe = 0

    # -- queries -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.me.name

    def take_changes(self) -> tuple[dict[tuple[str, int], set[str]], set[str]]:
        """What changed since the last call, for the driver to hand on as events (the
        Ready half of etcd/raft's Ready/Advance): (model, version) → nodes whose holder
        advertisement changed, and the members whose status changed."""
        members, self._status_changed = self._status_changed, set()
        return self.holders.take_changed(), members

    def alive(self) -> list[str]:
        """Members not known dead (self included), sorted; cached between status changes."""
        if self._alive_cache is None:
            live = [m.name for m in self.members.records() if m.status is not Status.DEAD]
            self._alive_cache = sorted(live + self.members.untouched())
        return self._alive_cache

    def status(self, name: str) -> Status | None:
        m = self.members.get(name)
        return m.status if m else None

    def locality_of(self, name: str) -> str | None:
        m = self.members.get(name)
        return m.locality if m is not None and m.status is not Status.DEAD else None

    def addr_of(self, name: str) -> str | None:
        m = self.members.get(name)
        return m.addr if m else None

    # -- own state -----------------------------------------------------------------------------

    def set_local(self, key: str, value: bytes) -> None:
        self.state.set(key, value, self.now)
        self.holders.update(self.name, key, value)

    def delete_local(self, key: str) -> None:
        self.state.delete(key, self.now)
        self.holders.update(self.name, key, None)

    def bootstrap(self, roster: dict[str, tuple[str, str]], roster_id: int = 1) -> None:
        """Start out knowing a static member list ``name -> (addr, locality)`` alive,
        without gossiping about each of them. The roster is only read, so many cores may
        share one (the simulator does)."""
        own = self.members.records()
        self.members = MemberTable(roster, roster_id)
        for m in own:
            self.members[m.name] = m
        self._alive_cache = None

    def join(self) -> None:
        """Announce ourselves to the seeds (full push-pull)."""
        for s in self.seeds:
            self._send(s, self._push_pull(reply=True))

    # -- time ----------------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        cfg = self.cfg
        scale = 1 + self.awareness  # Lifeguard: a struggling node probes slower, waits longer
        p = self._probe
        if p is not None:
            if not p.acked and not p.indirect and self.now - p.start >= cfg.ack_ticks * scale:
                self._ping_req(p)
            if self.now - p.start >= cfg.round_ticks * scale - 1:
                self._finish_probe()
        if self._probe is None and self.now >= self._next_probe:
            self._start_probe()
            self._next_probe = self.now + cfg.round_ticks * scale
        for seq, (origin_addr, _origin, their_seq, deadline) in list(self._relays.items()):
            if self.now >= deadline:
                del self._relays[seq]
                self._send(origin_addr, GNack(their_seq, self.name, ""))
        self._expire_suspicions()
        if self.now % cfg.round_ticks == 0:
            self._round()

    def next_due(self) -> int:
        """The first tick after ``now`` at which :meth:`tick` may do more than count: the
        next round, the probe's ack wait or end (or the next probe), a relayed probe's
        deadline, a suspicion's expiry. Every tick before it only advances ``now``, so a
        driver may sleep until it and then tick up to it at once; a message received
        meanwhile can move it (an ack, a refutation raising awareness, a new relay or
        suspicion), so ask again after :meth:`receive`. Why: an idle node otherwise wakes
        every tick (50 times a second at 20 ms) to do nothing on nine in ten of them."""
        cfg = self.cfg
        scale = 1 + self.awareness
        due = (self.now // cfg.round_ticks + 1) * cfg.round_ticks
        p = self._probe
        if p is not None:
            if not p.acked and not p.indirect:
                due = min(due, p.start + cfg.ack_ticks * scale)
            due = min(due, p.start + cfg.round_ticks * scale - 1)
        else:
            due = min(due, self._next_probe)
        for _addr, _origin, _seq, deadline in self._relays.values():
            due = min(due, deadline)
        for name in self._suspects:
            due = min(due, self.members[name].deadline)
        return max(due, self.now + 1)

    def _round(self) -> None:
        cfg = self.cfg
        self._rounds += 1
        if self._broadcasts:
            for peer in self._random_peers(cfg.gossip_fanout):
                self._send(self.members[peer].addr, GGossip(self.name, self._updates()))
        peers = self._random_peers(cfg.sync_fanout)
        for peer in peers:
            self._send(self.members[peer].addr, GSyn(self.name, self.state.buckets()))
        if peers and self._rounds % cfg.push_pull_rounds == 0:
            self._send(self.members[peers[0]].addr, self._push_pull(reply=True))
        live = bool(peers)
        if self._rounds % cfg.rejoin_rounds == 0:
            lost = [m.addr for m in self.members.records() if m.status is Status.DEAD]
            lost += [m.addr for m in self.dead_memory.values()]
            if not live:
                lost += self.seeds
            if lost:
                addr = lost[self.rng.randrange(0, len(lost))]
                self._send(addr, self._push_pull(reply=True))
        self._reap()
        self.state.gc(self.now, cfg.tombstone_rounds * cfg.round_ticks)

    # -- probing -------------------------------------------------------------------------------

    def _random_peers(self, k: int, exclude: tuple[str, ...] = ()) -> list[str]:
        """Up to ``k`` distinct random live members other than us and ``exclude``."""
        alive = self.alive()
        skip = {self.name, *exclude}
        want = min(
            k,
            len(alive)
            - sum(
                1
                for s in skip
                if self.members.get(s) is not None and self.members[s].status is not Status.DEAD
            ),
        )
        out: list[str] = []
        while len(out) < want:
            for n in self.rng.sample(alive, min(len(alive), want + len(skip))):
                if n not in skip and n not in out:
                    out.append(n)
                    if len(out) == want:
                        break
        return out

    def _next_target(self) -> str | None:
        for _ in range(2):
            while self._order:
                n = self._order.pop()
                m = self.members.get(n)
                if m is not None and m.status is not Status.DEAD and n != self.name:
                    return n
            self._order = [n for n in self.alive() if n != self.name]
            self.rng.shuffle(self._order)
        return None

    def _start_probe(self) -> None:
        target = self._next_target()
        if target is None:
            self._probe = None
            return
        self._seq += 1
        self._probe = _Probe(self._seq, target, self.now)
        self._send(
            self.members[target].addr,
            GPing(self._seq, self.name, self.me.inc, target, self._updates()),
        )

    def _ping_req(self, p: _Probe) -> None:
        p.indirect = True
        for h in self._random_peers(self.cfg.indirect_checks, exclude=(p.target,)):
            self._send(
                self.members[h].addr,
                GPingReq(p.seq, self.name, self.me.inc, p.target, self._updates()),
            )

    def _finish_probe(self) -> None:
        p = self._probe
        if p is None:
            return
        self._probe = None
        if p.acked:
            self.awareness = max(0, self.awareness - 1)
            return
        if p.indirect and p.nacks < min(self.cfg.indirect_checks, len(self.alive()) - 2):
            # Helpers did not even answer with nacks: our own links may be the problem.
            self.awareness = min(self.cfg.max_awareness, self.awareness + 1)
        m = self.members.get(p.target)
        if m is not None and m.status is Status.ALIVE:
            self._suspect(m, m.inc, self.name)

    # -- receiving -----------------------------------------------------------------------------

    def receive(self, msg: Message) -> list[Change]:
        """Handle one message; returns holder-state changes (also applied to ``holders``)."""
        if isinstance(msg, GPing):
            self._apply_updates(msg.updates)
            frm = self.members.get(msg.frm)
            if msg.target == self.name and frm is not None:
                updates = self._updates()
                if frm.status is Status.DEAD and msg.inc <= frm.inc:
                    updates = (frm.update(), *updates)  # tell it it was declared dead
                self._send(frm.addr, GAck(msg.seq, self.name, self.me.inc, self.name, updates))
        elif isinstance(msg, GAck):
            self._apply_updates(msg.updates)
            relay = self._relays.pop(msg.seq, None)
            if relay is not None:
                origin_addr, _origin, their_seq, _ = relay
                self._send(origin_addr, GAck(their_seq, self.name, self.me.inc, msg.target))
            elif (
                self._probe is not None
                and msg.seq == self._probe.seq
                and msg.target == self._probe.target
            ):
                self._probe.acked = True
        elif isinstance(msg, GPingReq):
            self._apply_updates(msg.updates)
            target, origin = self.members.get(msg.target), self.members.get(msg.frm)
            if target is not None and origin is not None:
                self._seq += 1
                self._relays[self._seq] = (
                    origin.addr,
                    origin.name,
                    msg.seq,
                    self.now + self.cfg.round_ticks - 1,
                )
                self._send(target.addr, GPing(self._seq, self.name, self.me.inc, msg.target))
        elif isinstance(msg, GGossip):
            self._apply_updates(msg.updates)
        elif isinstance(msg, GNack):
            if self._probe is not None and msg.seq == self._probe.seq:
                self._probe.nacks += 1
        elif isinstance(msg, GPushPull):
            self._apply_updates(msg.members)
            frm = self.members.get(msg.frm)
            same = msg.roster != 0 and msg.roster == self.members.roster_id
            if msg.need_full and frm is not None:
                self._send(frm.addr, self._push_pull(reply=False, full=True))
            elif msg.reply and frm is not None:
                self._send(
                    frm.addr,
                    GPushPull(
                        self.name,
                        tuple(self.members.updates(full=not same)),
                        False,
                        self.members.roster_id,
                        need_full=msg.roster != 0 and not same,
                    ),
                )
            elif msg.reply:
                dead = self.dead_memory.get(msg.frm)
                if dead is not None:  # a reaped node is back: tell it, so it refutes
                    back = next((u.addr for u in msg.members if u.name == msg.frm), dead.addr)
                    self._send(back, GPushPull(self.name, (dead.update(),), False))
        elif isinstance(msg, GSyn):
            frm = self.members.get(msg.frm)
            diff = self.state.differing(msg.buckets)
            if frm is not None and diff:
                digest, covered = self.state.digest(diff)
                self._send(frm.addr, GSynAck(self.name, digest, covered))
        elif isinstance(msg, GSynAck):
            frm = self.members.get(msg.frm)
            if frm is not None:
                deltas = self.state.deltas_for(msg.digest, msg.buckets)
                digest, _ = self.state.digest(msg.buckets)
                self._send(frm.addr, GDelta(self.name, deltas, digest, msg.buckets, True))
        elif isinstance(msg, GDelta):
            changes = self._merge(msg)
            frm = self.members.get(msg.frm)
            if msg.reply and frm is not None:
                deltas = self.state.deltas_for(msg.digest, msg.buckets)
                if deltas:
                    self._send(frm.addr, GDelta(self.name, deltas))
            return changes
        return []

    def _merge(self, msg: GDelta) -> list[Change]:
        def accept(name: str, generation: int) -> bool:
            # Only live members, and never state from a life older than membership knows of.
            m = self.members.get(name)
            return m is not None and m.status is not Status.DEAD and generation >= m.generation

        changes = self.state.apply(msg.deltas, accept, self.now)
        for node, key, value in changes:
            self.holders.update(node, key, value)
        return changes

    # -- membership rules ----------------------------------------------------------------------

    def _apply_updates(self, updates: Iterable[Update]) -> None:
        for u in updates:
            status = u.status
            if u.name == self.name:
                if status != Status.ALIVE and u.inc >= self.me.inc:
                    self._refute(u.inc)
                continue
            m = self.members.get(u.name)
            if status == Status.ALIVE:
                self._alive(u, m)
            elif status == Status.SUSPECT:
                if m is not None and m.status is not Status.DEAD and u.inc >= m.inc:
                    if m.status is Status.SUSPECT and u.inc == m.inc:
                        self._confirm(m, u.origin or "?")
                    else:
                        self._suspect(m, u.inc, u.origin or "?")
            elif m is not None and u.inc >= m.inc and m.status is not Status.DEAD:
                self._dead(m, u.inc)

    def _alive(self, u: Update, m: Member | None) -> None:
        if m is None:
            gone = self.dead_memory.get(u.name)
            if gone is not None and u.inc <= gone.inc:
                return  # stale news of a reaped member
            self.dead_memory.pop(u.name, None)
            m = self.members[u.name] = Member(
                u.name, u.addr, u.locality, u.inc, Status.ALIVE, generation=u.generation
            )
            self._set_status(m, Status.ALIVE, new=True)
            self._queue(m.update())
            return
        if u.inc <= m.inc:
            return
        was_dead = m.status is Status.DEAD
        m.inc, m.addr, m.locality = u.inc, u.addr, u.locality
        m.generation = max(m.generation, u.generation)
        m.suspecters.clear()
        self._set_status(m, Status.ALIVE)
        held = self.state.generation(m.name)
        if held is not None and (was_dead or held < m.generation):
            self._drop_state(m.name)  # what it held in a previous life is gone (G6, G7)
        self._queue(m.update())

    def _drop_state(self, name: str) -> None:
        for node, key, value in self.state.drop(name):
            self.holders.update(node, key, value)

    def _suspect(self, m: Member, inc: int, by: str) -> None:
        n = len(self.alive())
        times = SuspicionTimes.for_cluster(
            n, self.cfg.round_ticks, self.cfg.suspicion_mult, self.cfg.suspicion_max_mult
        )
        m.inc = inc
        m.suspecters = {by}
        m.deadline = self.now + times.timeout(1)
        self._set_status(m, Status.SUSPECT)
        u = Update(m.name, m.addr, m.locality, inc, int(Status.SUSPECT), by)
        self._queue(u)
        if by == self.name:  # tell the suspect at once: it may be alive and refute
            self._send(m.addr, GGossip(self.name, (u,)))

    def _confirm(self, m: Member, by: str) -> None:
        if by in m.suspecters:
            return
        m.suspecters.add(by)
        times = SuspicionTimes.for_cluster(
            len(self.alive()),
            self.cfg.round_ticks,
            self.cfg.suspicion_mult,
            self.cfg.suspicion_max_mult,
        )
        m.deadline = min(m.deadline, m.since + times.timeout(len(m.suspecters)))
        self._queue(Update(m.name, m.addr, m.locality, m.inc, int(Status.SUSPECT), by))

    def _dead(self, m: Member, inc: int) -> None:
        m.inc = inc
        self._set_status(m, Status.DEAD)
        self._drop_state(m.name)
        self._queue(m.update())

    def _refute(self, inc: int) -> None:
        self.me.inc = max(self.me.inc, inc) + 1
        self.awareness = min(self.cfg.max_awareness, self.awareness + 1)
        self._queue(self.me.update())

    def _expire_suspicions(self) -> None:
        # Sorted: set order follows PYTHONHASHSEED, and a seed must reproduce a run.
        for name in sorted(n for n in self._suspects if self.now >= self.members[n].deadline):
            self._dead(self.members[name], self.members[name].inc)

    def _reap(self) -> None:
        limit = self.cfg.reap_rounds * self.cfg.round_ticks
        for name in sorted(n for n in self._dead_set if self.now - self.members[n].since >= limit):
            self.dead_memory[name] = self.members.pop(name)
            self._dead_set.discard(name)

    def _set_status(self, m: Member, status: Status, new: bool = False) -> None:
        if m.status is not status or new:
            m.since = self.now
        if new or (m.status is Status.DEAD) != (status is Status.DEAD):
            self._alive_cache = None  # suspects count as alive: only deaths change the list
        m.status = status
        (self._suspects.add if status is Status.SUSPECT else self._suspects.discard)(m.name)
        (self._dead_set.add if status is Status.DEAD else self._dead_set.discard)(m.name)
        self.events.append((self.now, m.name, status))
        self._status_changed.add(m.name)

    # -- dissemination -------------------------------------------------------------------------

    def _retransmits(self) -> int:
        return self.cfg.retransmit_mult * max(1, math.ceil(math.log10(len(self.members) + 1)))

    def _queue(self, u: Update) -> None:
        # Newest last: the freshest facts (fewest transmissions so far) go out first.
        self._broadcasts.pop(u.name, None)
        self._broadcasts[u.name] = (u, self._retransmits())

    def _updates(self) -> tuple[Update, ...]:
        if not self._broadcasts:
            return ()
        chosen = list(itertools.islice(reversed(self._broadcasts.items()), self.cfg.max_updates))
        out = []
        for name, (u, left) in chosen:
            out.append(u)
            if left <= 1:
                del self._broadcasts[name]
            else:
                self._broadcasts[name] = (u, left - 1)
        return tuple(out)

    def _push_pull(self, reply: bool, full: bool = False) -> GPushPull:
        """A push-pull; unless ``full``, roster members we never touched are left out (the
        peer asks for them with ``need_full`` if it does not share our roster)."""
        return GPushPull(
            self.name, tuple(self.members.updates(full=full)), reply, self.members.roster_id
        )

    def _send(self, addr: str, msg: Message) -> None:
        self.outbox.append((addr, msg))
