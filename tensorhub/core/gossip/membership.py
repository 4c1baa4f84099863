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
