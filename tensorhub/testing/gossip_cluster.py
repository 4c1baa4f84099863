"""A deterministic, simulated gossip cluster: real GossipCores, a tick-driven network.

Messages sent during tick t are delivered at tick t+1 (in a seeded shuffled order), or lost
with probability ``loss``; partitions cut pairs of groups; paused nodes neither tick nor
receive (what they miss is lost, as with a stalled process whose peers time out). Each node
has a tiny "disk" holding its incarnation and generation, so a restart comes back with
fresh ones, as the real driver does. Every write a node makes is recorded, so tests can
check that what others hold about a node is only ever what that node wrote (G3).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

from ..core.gossip import GossipConfig, GossipCore, Status
from ..core.gossip.state import Change
from ..core.messages import Message


@dataclass
class Disk:
    incarnation: int = 0
    generation: int = 0


class GossipCluster:
    def __init__(
        self,
        n: int,
        seed: int = 0,
        *,
        loss: float = 0.0,
        config: GossipConfig | None = None,
        bootstrapped: bool = True,
        dcs: int = 2,
        racks_per_dc: int = 4,
        check_due: bool = False,
    ) -> None:
        """``check_due``: before every node's tick, ask it when it is next due
        (``GossipCore.next_due``) and fail if a tick before that did more than count."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.cfg = config or GossipConfig()
        self.loss = loss
        self.check_due = check_due
        self.names = [f"g{i}" for i in range(n)]
        self.addr = {nm: f"addr-{nm}" for nm in self.names}
        self.by_addr = {a: nm for nm, a in self.addr.items()}
        self.locality = {
            nm: f"dc{i % dcs}/rack{(i // dcs) % racks_per_dc}/host{i}"
            for i, nm in enumerate(self.names)
        }
        self.disks = {nm: Disk() for nm in self.names}
        self.nodes: dict[str, GossipCore] = {}
        self.down: set[str] = set()
        self.paused: set[str] = set()
        self.group: dict[str, int] = {}
        self.inflight: list[tuple[str, Message]] = []
        self.ticks = 0
        self.written: dict[tuple[str, int, str, int], bytes | None] = {}
        self.seeds = [self.addr[nm] for nm in self.names[:3]]
        for nm in self.names:
            self._boot(nm)
        if bootstrapped:
            roster = {nm: (self.addr[nm], self.locality[nm]) for nm in self.names}
            for core in self.nodes.values():
                core.bootstrap(roster)  # one shared, read-only roster
        else:
            for core in self.nodes.values():
                core.join()

    def _boot(self, nm: str) -> None:
        d = self.disks[nm]
        rng = random.Random(f"{self.seed}/{nm}/{d.incarnation}")
        self.nodes[nm] = GossipCore(
            nm,
            self.addr[nm],
            self.locality[nm],
            rng,
            config=self.cfg,
            incarnation=d.incarnation,
            generation=d.generation,
            seeds=self.seeds,
        )

    # -- faults --------------------------------------------------------------------------------

    def crash(self, nm: str) -> None:
        self.down.add(nm)

    def restart(self, nm: str) -> None:
        """Come back from disk: a higher incarnation and a new generation."""
        d = self.disks[nm]
        d.incarnation += 1
        d.generation += 1
        self.down.discard(nm)
        self._boot(nm)
        self.nodes[nm].join()

    def partition(self, *groups: Iterable[str]) -> None:
        self.group = {nm: gi for gi, g in enumerate(groups) for nm in g}

    def heal(self) -> None:
        self.group = {}

    def live(self) -> list[str]:
        return [nm for nm in self.names if nm not in self.down]

    # -- driving -------------------------------------------------------------------------------

    def write(self, nm: str, key: str, value: bytes | None) -> None:
        core = self.nodes[nm]
        if value is None:
            core.delete_local(key)
        else:
            core.set_local(key, value)
        st = core.state.nodes[nm]
        self.written[(nm, st.generation, key, st.max_version)] = value

    def tick(self) -> None:
        self.ticks += 1
        batch, self.inflight = self.inflight, []
        self.rng.shuffle(batch)
        for addr, msg in batch:
            nm = self.by_addr.get(addr)
            if nm is None or nm in self.down or nm in self.paused:
                continue
            if self.loss and self.rng.random() < self.loss:
                continue
            sender = str(getattr(msg, "frm", ""))
            if self.group and self.group.get(sender, -1) != self.group.get(nm, -2):
                continue
            self._check_owner_only(self.nodes[nm].receive(msg))
        for nm in self.names:
            if nm in self.down or nm in self.paused:
                continue
            core = self.nodes[nm]
            if self.check_due:
                due, before, sent = core.next_due(), _busy_state(core), len(core.outbox)
                core.tick()  # (the outbox holds the replies to what it received already)
                if core.now < due and (len(core.outbox) > sent or _busy_state(core) != before):
                    raise AssertionError(
                        f"seed {self.seed}: {nm} did more than count at tick {core.now}, "
                        f"before the tick next_due said ({due})"
                    )
            else:
                core.tick()
            if core.outbox:
                self.inflight.extend(core.outbox)
                core.outbox.clear()

    def run_rounds(self, rounds: int) -> None:
        for _ in range(rounds * self.cfg.round_ticks):
            self.tick()

    @property
    def rounds(self) -> float:
        return self.ticks / self.cfg.round_ticks

    # -- invariants ----------------------------------------------------------------------------

    def _check_owner_only(self, changes: list[Change]) -> None:
        for node, key, _value in changes:
            # Whatever anyone holds about `node` was written by `node` itself (G3).
            for holder in self.nodes.values():
                st = holder.state.nodes.get(node)
                kv = st.kvs.get(key) if st else None
                if st is None or kv is None:
                    continue
                want = self.written.get((node, st.generation, key, kv.version), b"\0missing")
                got = None if kv.deleted else kv.value
                if want != got:
                    raise AssertionError(
                        f"G3: {holder.name} holds {node}:{key}@{kv.version} "
                        "that the owner never wrote"
                    )
                break

    def trace_hash(self) -> str:
        """A digest of everything observable: every node's status events, buckets and
        members. Equal seeds must give equal hashes, in any process (tests check it)."""
        h = xxhash.xxh3_128()
        for nm in self.names:
            core = self.nodes[nm]
            h.update(
                repr(
                    (
                        nm,
                        core.events,
                        core.state.buckets(),
                        core.me.inc,
                        sorted((u.name, u.inc, u.status) for u in core.members.updates()),
                        len(core.outbox),
                    )
                ).encode()
            )
        h.update(repr(sorted(self.inflight, key=repr)).encode())
        return str(h.hexdigest())

    def knows(self, observer: str, node: str, key: str) -> bytes | None:
        return self.nodes[observer].state.get(node, key)

    def status(self, observer: str, node: str) -> Status | None:
        return self.nodes[observer].status(node)


def _busy_state(core: GossipCore) -> tuple[object, ...]:
    """What a tick changes when it does more than count (``now``): the probe, the probing
    order and pace, awareness, relayed probes, suspicions and statuses, queued news."""
    p = core._probe
    return (
        None if p is None else (p.seq, p.target, p.start, p.acked, p.indirect, p.nacks),
        core._next_probe,
        core._rounds,
        core.awareness,
        tuple(sorted(core._relays.items())),
        tuple(sorted(core._suspects)),
        tuple((m.name, m.status, m.inc) for m in core.members.records()),
        len(core.events),
        core.events[-1] if core.events else None,
        tuple((name, left) for name, (_u, left) in core._broadcasts.items()),
    )
