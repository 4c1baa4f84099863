"""A flow-level network: links with a capacity, flows over paths of links, max-min fair.

A chunk transfer is one flow. Whenever a flow starts or ends, every flow's rate is
recomputed by progressive filling (the max-min fair allocation: raise all rates together;
a link that fills freezes the flows through it), and the next completion is scheduled.
Packets are not modelled: that is what lets thousands of nodes and terabytes of weights
simulate in seconds. Propagation delay is added once, at the start of a flow.

A flow may follow an *upstream* flow (cut-through: forwarding bytes still arriving): once
it has caught up with the upstream's bytes it moves no faster than the upstream does.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .engine import Engine, _Event

INF = float("inf")
_ROUNDS = itertools.count(1)
"""Stamps of progressive fillings, unique across networks (a link may serve several)."""
CATCH_UP = 1e-3
"""A follower within this fraction of its size of its upstream's bytes has caught up: a
byte-exact test made followers flap between capped and free, an event every nanosecond."""


@dataclass(eq=False)
class Link:
    name: str
    capacity: float  # bytes per second
    carried: float = 0.0  # bytes, for utilization
    flows: dict[int, Flow] = field(default_factory=dict)  # ordered: runs are deterministic
    # Scratch of one progressive filling (``Network._fill``), valid while ``stamp`` is its
    # round: kept on the link because dict lookups by name were most of the filling's time.
    stamp: int = 0
    left: float = 0.0
    active: int = 0


@dataclass(eq=False)
class Flow:
    path: tuple[Link, ...]
    remaining: float
    done: Callable[[], None]
    rate: float = 0.0
    tag: str = ""
    id: int = 0
    upstream: Flow | None = None
    cap: Link | None = None  # private link: the upstream's rate once caught up
    slack: float = 0.0  # bytes within which it counts as caught up
    frozen: int = 0  # the filling round that fixed its rate


@dataclass(eq=False)
class Transfer:
    flow: Flow | None = None
    cancelled: bool = False


class Network:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.flows: dict[int, Flow] = {}
        self._ids = 0
        self._last = 0.0
        self._next: _Event | None = None
        self._settle: _Event | None = None

    def start(
        self,
        path: Sequence[Link],
        nbytes: float,
        done: Callable[[], None],
        latency: float = 0.0,
        tag: str = "",
        upstream: Transfer | None = None,
    ) -> Transfer:
        """Move ``nbytes`` over ``path``; call ``done`` when the last byte arrives. With
        ``upstream``, never get ahead of the bytes that transfer has moved."""
        t = Transfer()

        def begin() -> None:
            if t.cancelled:
                return
            self._advance()
            self._ids += 1
            up = upstream.flow if upstream is not None else None
            links = tuple(path)
            cap = None
            if up is not None and up.id in self.flows:
                cap = Link(f"cap/{self._ids}", INF)
                links = (*links, cap)
            else:
                up = None
            f = Flow(links, float(nbytes), done, tag=tag, id=self._ids, upstream=up, cap=cap)
            f.slack = CATCH_UP * float(nbytes)
            t.flow = f
            self.flows[f.id] = f
            for link in f.path:
                link.flows[f.id] = f
            self._changed()

        if latency > 0:
            self.engine.later(latency, begin)
        else:
            begin()
        return t

    def set_capacity(self, link: Link, capacity: float) -> None:
        """Change a link's rate now (0: cut; its flows stall until it comes back)."""
        self._advance()
        link.capacity = capacity
        self._changed()

    def cancel(self, t: Transfer) -> None:
        """Stop a transfer (its sender or receiver died): its ``done`` is never called."""
        t.cancelled = True
        f = t.flow
        if f is not None and f.id in self.flows:
            self._advance()
            del self.flows[f.id]
            for link in f.path:
                del link.flows[f.id]
            self._changed()

    def _changed(self) -> None:
        """Rates are stale: recompute them once this instant's other events have run.
        Flows start, end and are cancelled in bursts at one instant (a completion starts
        the next request; a pause starts a pull from every trainer host), and each
        progressive filling costs O(flows x hops): one filling per instant instead of one
        per change. Nothing moves in between (no virtual time passes), so the rates are the
        same as with a filling after every change."""
        if self._settle is None:
            self._settle = self.engine.later(0.0, self._settled)

    def _settled(self) -> None:
        self._settle = None
        self._reallocate()

    def _advance(self) -> None:
        dt = self.engine.now - self._last
        if dt > 0:
            for f in self.flows.values():
                moved = f.rate * dt
                f.remaining -= moved
                for link in f.path:
                    link.carried += moved
        self._last = self.engine.now

    def _reallocate(self) -> None:
        """Max-min fair rates, capping flows that caught up with their upstream at its rate
        (a few rounds: a chain of followers settles top-down); then schedule the next event:
        a completion, or a follower catching up."""
        followers = [f for f in self.flows.values() if f.cap is not None]
        for f in followers:
            assert f.cap is not None
            f.cap.capacity = INF
        for _ in range(4):
            self._fill()
            changed = False
            for f in followers:
                up = f.upstream
                assert f.cap is not None and up is not None
                if up.id not in self.flows:
                    continue  # upstream finished (or was cancelled): no constraint left
                if f.remaining <= up.remaining + f.slack and f.rate > up.rate * (1 + 1e-9):
                    f.cap.capacity = up.rate
                    changed = True
            if not changed:
                break
        if self._next is not None:
            self._next.cancelled = True
            self._next = None
        if self.flows:
            wait = min(
                max(f.remaining, 0.0) / f.rate if f.rate > 0 else INF for f in self.flows.values()
            )
            for f in followers:
                up = f.upstream
                assert up is not None
                ahead = f.remaining - up.remaining
                if up.id in self.flows and ahead > f.slack and f.rate > up.rate:
                    wait = min(wait, (ahead - f.slack / 2) / (f.rate - up.rate))
            if wait < INF:
                self._next = self.engine.later(wait, self._complete)

    def _fill(self) -> None:
        """Max-min fair rates by progressive filling.

        The link that fills first is popped from a heap keyed by its fair share, so a
        reallocation costs O((links + flows x hops) log links) instead of a scan of every
        link per frozen level. Keys are lazy: freezing flows at the least share only ever
        raises the shares of the other links they cross, so a key is a lower bound of its
        link's share, and a popped link whose share has risen goes back in at its share.
        Pushing every touched link at every level instead was 13 M heap operations in a
        4,096-GPU simulation, most of them for links that never came up before they moved
        again. The order links fill in (by share, then name) is the same either way.
        """
        stamp = next(_ROUNDS)
        heap: list[tuple[float, str, Link]] = []
        for f in self.flows.values():
            f.rate = 0.0
            for link in f.path:
                if link.stamp != stamp:
                    link.stamp, link.left, link.active = stamp, link.capacity, len(link.flows)
                    heap.append((link.left / link.active, link.name, link))
        heapq.heapify(heap)  # names are unique: a tie never compares the links
        heappop, heappush = heapq.heappop, heapq.heappush
        while heap:
            key, name, link = heappop(heap)
            n = link.active
            if n <= 0:
                continue  # every flow through it froze at another link
            share = link.left / n
            if share != key:
                heappush(heap, (share, name, link))  # it rose since: back in at its share
                continue
            for f in link.flows.values():
                if f.frozen == stamp:
                    continue
                f.frozen = stamp
                f.rate = share
                for lk in f.path:
                    lk.left -= share
                    lk.active -= 1
            link.active = 0

    def _complete(self) -> None:
        self._next = None
        self._advance()
        finished = [f for f in self.flows.values() if f.remaining <= 1e-6 * max(1.0, f.rate)]
        for f in finished:
            del self.flows[f.id]
            for link in f.path:
                del link.flows[f.id]
        self._changed()
        for f in finished:  # in start order: deterministic
            f.done()
