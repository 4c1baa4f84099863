"""A flow-level network: links with a capacity, flows over paths of links, max-min fair.

A chunk transfer is one flow. Whenever a flow starts or ends, every flow's rate is
recomputed by progressive filling (the max-min fair allocation: raise all rates together;
a link that fills freezes the flows through it), and the next completion is scheduled.
Packets are not modelled: that is what lets thousands of nodes and terabytes of weights
simulate in seconds. Propagation delay is added once, at the start of a flow.

A flow may follow an *upstream* flow (cut-through: forwarding bytes still arriving): once
it has caught up with the upstream's bytes it moves no faster than the upstream does.

Flows may share a *line* (one TCP connection): they then move one after the other, each
starting when the one before it ends, as frames written whole to one socket do, instead of
sharing its rate. Sharing would finish every chunk of a burst at once, late, and a relay
forwards none of them until then.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
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
    line: Hashable | None = None  # the connection it holds while it moves


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
        self._dirty: dict[Link, None] = {}  # links whose flows' rates are stale (ordered)
        self._followers: dict[int, list[Flow]] = {}  # upstream flow id -> its followers
        self._busy: set[Hashable] = set()  # lines a flow holds
        self._waiting: dict[Hashable, deque[Callable[[], None]]] = {}  # line -> next starts

    def start(
        self,
        path: Sequence[Link],
        nbytes: float,
        done: Callable[[], None],
        latency: float = 0.0,
        tag: str = "",
        upstream: Transfer | None = None,
        line: Hashable | None = None,
    ) -> Transfer:
        """Move ``nbytes`` over ``path``; call ``done`` when the last byte arrives. With
        ``upstream``, never get ahead of the bytes that transfer has moved; with ``line``,
        wait for the flows before it on that line to end first."""
        t = Transfer()

        def begin() -> None:
            if t.cancelled:
                return
            if line is not None and line in self._busy:
                self._waiting.setdefault(line, deque()).append(begin)
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
            f = Flow(
                links, float(nbytes), done, tag=tag, id=self._ids, upstream=up, cap=cap, line=line
            )
            if line is not None:
                self._busy.add(line)
            f.slack = CATCH_UP * float(nbytes)
            t.flow = f
            self.flows[f.id] = f
            for link in f.path:
                link.flows[f.id] = f
            if up is not None:
                self._followers.setdefault(up.id, []).append(f)
            self._changed(f.path)

        if latency > 0:
            self.engine.later(latency, begin)
        else:
            begin()
        return t

    def set_capacity(self, link: Link, capacity: float) -> None:
        """Change a link's rate now (0: cut; its flows stall until it comes back)."""
        self._advance()
        link.capacity = capacity
        self._changed((link,))

    def cancel(self, t: Transfer) -> None:
        """Stop a transfer (its sender or receiver died): its ``done`` is never called."""
        t.cancelled = True
        f = t.flow
        if f is not None and f.id in self.flows:
            self._advance()
            self._remove(f)

    def _remove(self, f: Flow) -> None:
        """Take a flow off the network; its links' rates, and its followers', are stale."""
        del self.flows[f.id]
        for link in f.path:
            del link.flows[f.id]
        self._changed(f.path)
        for g in self._followers.pop(f.id, ()):
            self._changed(g.path)  # no upstream to keep behind any more
        up = f.upstream
        if up is not None and (mine := self._followers.get(up.id)) is not None:
            mine.remove(f)
        if f.line is not None:
            self._next_on(f.line)

    def _next_on(self, line: Hashable) -> None:
        """The flow holding ``line`` ended: start the next one waiting (a cancelled one
        does not start, and passes the line on)."""
        self._busy.discard(line)
        waiting = self._waiting.get(line)
        while waiting and line not in self._busy:
            waiting.popleft()()
        if waiting is not None and not waiting:
            del self._waiting[line]

    def _changed(self, links: Iterable[Link]) -> None:
        """The rates of the flows through ``links`` are stale: recompute them once this
        instant's other events have run. Flows start, end and are cancelled in bursts at
        one instant (a completion starts the next request; a pause starts a pull from every
        trainer host), and each progressive filling costs O(flows x hops): one filling per
        instant instead of one per change. Nothing moves in between (no virtual time
        passes), so the rates are the same as with a filling after every change."""
        for link in links:
            self._dirty[link] = None
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

    def _component(self) -> list[Flow]:
        """The flows whose rates may have changed: those sharing a link, transitively, with
        a stale link, and the followers of any of them (capped at an upstream's rate, they
        move with it). Max-min rates of flows that share no link are independent, so the
        rest keep theirs: a 4,096-GPU standalone run had 18 such groups on average, the
        largest 31 of 112 flows, and refilling all of them was most of its time."""
        todo = list(self._dirty)
        self._dirty = {}
        links = set(todo)
        flows: dict[int, Flow] = {}
        while todo:
            for f in todo.pop().flows.values():
                if f.id in flows:
                    continue
                flows[f.id] = f
                for g in (f, *self._followers.get(f.id, ())):
                    for lk in g.path:
                        if lk not in links:
                            links.add(lk)
                            todo.append(lk)
        return sorted(flows.values(), key=lambda f: f.id)  # start order: as self.flows

    def _cap(self, f: Flow) -> bool:
        """Cap a follower that has caught up with its upstream at the upstream's rate, or
        move its cap to that rate, which a filling may have moved (a cap only ever lowered
        once left a follower at its upstream's old rate, half its new one); whether it
        changed."""
        up = f.upstream
        assert f.cap is not None and up is not None
        if up.id not in self.flows or f.remaining > up.remaining + f.slack:
            return False  # upstream finished (or was cancelled), or not caught up yet
        cap = f.cap.capacity
        if (cap == INF and f.rate > up.rate * (1 + 1e-9)) or cap not in (INF, up.rate):
            f.cap.capacity = up.rate
            return True
        return False

    def _mark_caught_up(self) -> None:
        """Followers that have caught up with their upstream but are not capped yet are
        stale: capped at the next filling, as a filling of every flow would cap them (a
        catch-up event is scheduled for each, but any earlier filling also catches it)."""
        for ups in self._followers.values():
            for f in ups:
                up = f.upstream
                assert f.cap is not None and up is not None
                if (
                    f.cap.capacity == INF
                    and f.remaining <= up.remaining + f.slack
                    and f.rate > up.rate * (1 + 1e-9)
                ):
                    for link in f.path:
                        self._dirty[link] = None

    def _rates(self, flows: Sequence[Flow]) -> None:
        """Max-min rates of ``flows`` (every flow through their links among them), the
        followers among them uncapped first, then capped at their upstreams' rates in
        rounds until no cap moves: each round settles at least one more level of a chain
        of followers. (Four rounds at most, until session 9, left the fifth level of a
        cut-through chain across the WAN filled past its cap, faster than its upstream.)"""
        followers = [f for f in flows if f.cap is not None]
        for f in followers:
            assert f.cap is not None
            f.cap.capacity = INF
        for _ in range(len(followers) + 1):
            self._fill(flows)
            changed = False
            for f in followers:
                changed |= self._cap(f)
            if not changed:
                break

    def _reallocate(self) -> None:
        """Max-min fair rates of the stale flows (:meth:`_component`), capping flows that
        caught up with their upstream at its rate (in rounds until no cap moves: a chain of
        followers settles top-down); then schedule the next event: a completion, or a
        follower catching up."""
        self._mark_caught_up()
        self._rates(self._component())
        if self._next is not None:
            self._next.cancelled = True
            self._next = None
        if self.flows:
            wait = INF
            for f in self.flows.values():  # (a loop: this runs for every flow, every event)
                rate = f.rate
                if rate > 0:
                    left = f.remaining / rate if f.remaining > 0 else 0.0
                    wait = min(wait, left)
            for ups in self._followers.values():
                for f in ups:
                    up = f.upstream
                    assert up is not None
                    ahead = f.remaining - up.remaining
                    if ahead > f.slack and f.rate > up.rate:
                        wait = min(wait, (ahead - f.slack / 2) / (f.rate - up.rate))
            if wait < INF:
                self._next = self.engine.later(wait, self._complete)

    def _fill(self, flows: Sequence[Flow]) -> None:
        """Max-min fair rates of ``flows`` (every flow through their links among them) by
        progressive filling.

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
        for f in flows:
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
            self._remove(f)
        self._changed(())  # at least the next event is to be scheduled again
        for f in finished:  # in start order: deterministic
            f.done()
