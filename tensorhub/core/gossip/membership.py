"""SWIM membership with Lifeguard's refinements (the rules; scheduling lives in core.py).

- Each update is a fact ``(name, incarnation, status)``. ALIVE overrides SUSPECT or DEAD
  only with a strictly higher incarnation, which only the node itself issues (refutation),
  so a stale ALIVE can never resurrect a dead node (G6).
- Suspicion (Lifeguard): a suspect is declared dead after a timeout that starts at
  ``max`` and shrinks toward ``min`` as independent suspecters confirm it.
- Dead members are reaped after a while but remembered (name → incarnation), so stale
  gossip about them is refused; the node itself can come back by refuting with a higher
  incarnation (rediscovery after long partitions, G8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

from .messages import Update


class Status(IntEnum):
    ALIVE = 0
    SUSPECT = 1
    DEAD = 2


@dataclass(slots=True)
class Member:
    name: str
    addr: str
    locality: str
    inc: int
    status: Status
    since: int = 0
    suspecters: set[str] = field(default_factory=set)
    deadline: int = 0  # for SUSPECT: tick at which it becomes DEAD
    generation: int = 0

    def update(self) -> Update:
        return Update(
            self.name,
            self.addr,
            self.locality,
            self.inc,
            int(self.status),
            generation=self.generation,
        )


@dataclass(frozen=True)
class SuspicionTimes:
    """Lifeguard's suspicion timeout, in ticks, for a cluster of ``n`` members."""

    min_ticks: int
    max_ticks: int
    expected_confirmations: int = 3

    @classmethod
    def for_cluster(cls, n: int, round_ticks: int, mult: int, max_mult: int) -> SuspicionTimes:
        base = mult * max(1.0, math.log10(max(n, 1))) * round_ticks
        return cls(int(base), int(base * max_mult))

    def timeout(self, confirmations: int) -> int:
        """Shrinks from max to min as confirmations (beyond the first suspecter) arrive."""
        c = max(confirmations - 1, 0)
        frac = math.log(c + 1) / math.log(self.expected_confirmations + 1)
        return max(self.min_ticks, int(self.max_ticks - (self.max_ticks - self.min_ticks) * frac))


class MemberTable:
    """The member list: records of our own, plus an optional shared roster.

    A roster is a read-only ``name -> (addr, locality)`` map of members known alive at
    incarnation 0 (a static bootstrap list). A roster member gets a record of its own the
    first time it is touched, so many nodes (or thousands of simulated ones) can share one
    roster instead of each holding N records they never look at.
    """

    def __init__(
        self, roster: dict[str, tuple[str, str]] | None = None, roster_id: int = 0
    ) -> None:
        self._own: dict[str, Member] = {}
        self._roster = roster or {}
        self.roster_id = roster_id if roster else 0
        self._gone: set[str] = set()  # roster names removed (reaped) from this table
        self._untouched = len(self._roster)

    def _from_roster(self, name: str) -> Member | None:
        if name not in self._roster or name in self._gone:
            return None
        addr, locality = self._roster[name]
        m = self._own[name] = Member(name, addr, locality, 0, Status.ALIVE)
        self._untouched -= 1
        return m

    def get(self, name: str) -> Member | None:
        m = self._own.get(name)
        return m if m is not None else self._from_roster(name)

    def __getitem__(self, name: str) -> Member:
        m = self.get(name)
        if m is None:
            raise KeyError(name)
        return m

    def __setitem__(self, name: str, m: Member) -> None:
        if name not in self._own and name in self._roster and name not in self._gone:
            self._untouched -= 1
        self._gone.discard(name)
        if name in self._roster and name in self._gone:
            self._gone.discard(name)
        self._own[name] = m

    def __contains__(self, name: object) -> bool:
        return name in self._own or (name in self._roster and name not in self._gone)

    def pop(self, name: str) -> Member:
        m = self[name]
        del self._own[name]
        if name in self._roster:
            self._gone.add(name)
        return m

    def __len__(self) -> int:
        return len(self._own) + self._untouched

    def names(self) -> list[str]:
        out = list(self._own)
        if self._untouched:
            out.extend(n for n in self._roster if n not in self._own and n not in self._gone)
        return out

    def untouched(self) -> list[str]:
        """Roster members never touched: alive at incarnation 0 by definition."""
        if not self._untouched:
            return []
        return [n for n in self._roster if n not in self._own and n not in self._gone]

    def records(self) -> list[Member]:
        """Members that have a record of their own (every non-default one)."""
        return list(self._own.values())

    def updates(self, full: bool = True) -> list[Update]:
        """Every member's update; with ``full=False``, only those with a record of their own
        (a peer with the same roster already knows the rest)."""
        out = [m.update() for m in self._own.values()]
        if not full:
            return out
        for n in self.untouched():
            addr, locality = self._roster[n]
            out.append(Update(n, addr, locality, 0, int(Status.ALIVE)))
        return out
