"""A flow-level network: links with a capacity, flows over paths of links, max-min fair.

A chunk transfer is one flow. Whenever a flow starts or ends, every flow's rate is
recomputed by progressive filling (the max-min fair allocation: raise all rates together;
a link that fills freezes the flows through it), and the next completion is scheduled.
Packets are not modelled: that is what lets thousands of nodes and terabytes of weights
simulate in seconds. Propagation delay is added once, at the start of a flow. Bytes are
counted when a rate changes, and the next completion comes off a heap, so an event costs
what its re-solve costs, not O(flows); ``depth`` bounds the re-solve (Scenario.solve_depth).

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
CATCH_TOLERANCE = 1e-6
"""Of the slack: how much further behind a follower at its catch-up event may be found
(the event's time is rounded): far above a double's error on these byte counts, far
below a chunk."""


@dataclass(eq=False)
class Link:
    name: str
    capacity: float  # bytes per second
    carried: float = 0.0  # bytes, for utilization: up to ``since`` (all, once flows end)
    flows: dict[int, Flow] = field(default_factory=dict)  # ordered: runs are deterministic
    load: float = 0.0  # the sum of its flows' rates
    since: float = 0.0  # when ``carried`` was last brought up to date
    # Scratch of one progressive filling (``Network._fill``), valid while ``stamp`` is its
    # round: kept on the link because dict lookups by name were most of the filling's time.
    stamp: int = 0
    left: float = 0.0
    active: int = 0


@dataclass(eq=False)
class Flow:
    path: tuple[Link, ...]
    remaining: float  # bytes left at time ``since`` (moving at ``rate`` since then)
    done: Callable[[], None]
    rate: float = 0.0
    since: float = 0.0
    finish: float = INF  # when its last byte arrives at its current rate
    catch: float = INF  # a follower: when it catches up with its upstream at these rates
    tag: str = ""
    id: int = 0
    upstream: Flow | None = None
    cap: Link | None = None  # private link: the upstream's rate once caught up
    slack: float = 0.0  # bytes within which it counts as caught up
    frozen: int = 0  # the filling round that fixed its rate
    line: Hashable | None = None  # the connection it holds while it moves
    cancelled: bool = False  # cancelled after its last byte, before its done was called


@dataclass(eq=False)
class Transfer:
    flow: Flow | None = None
    cancelled: bool = False


class Network:
    def __init__(self, engine: Engine, depth: int | None = None) -> None:
        self.engine = engine
        self.depth = depth  # see _component: None re-solves whole connected groups
        self.bounded = False  # the last re-solve stopped at ``depth``
        self.flows: dict[int, Flow] = {}
        self._ids = 0
        self._finishes: list[tuple[float, int, Flow]] = []  # (finish, id, flow); lazy
        self._catches: list[tuple[float, int, Flow]] = []  # (catch, id, follower); lazy
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
                links,
                float(nbytes),
                done,
                tag=tag,
                id=self._ids,
                upstream=up,
                cap=cap,
                line=line,
                since=self.engine.now,
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
        link.capacity = capacity
        self._changed((link,))

    def cancel(self, t: Transfer) -> None:
        """Stop a transfer (its sender or receiver died): its ``done`` is never called."""
        t.cancelled = True
        f = t.flow
        if f is not None and f.id in self.flows:
            self._remove(f)
        elif f is not None:
            # It finished in the batch being completed now (an earlier ``done`` of that
            # batch cancels it: a fetcher abandoning an endgame twin that also landed);
            # calling its ``done`` too released its sender's upload slot twice.
            f.cancelled = True

    def _remove(self, f: Flow) -> None:
        """Take a flow off the network; its links' rates, and its followers', are stale."""
        del self.flows[f.id]
        self._count(f)  # its bytes so far, on its links too
        for link in f.path:
            del link.flows[f.id]
            link.load -= f.rate
            if not link.flows:
                link.load = 0.0  # (no rounding left over from the additions)
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

    def _left(self, f: Flow) -> float:
        """``f``'s bytes left now. Bytes are counted lazily, when a flow's rate changes:
        moving every flow's count forward at every event was O(flows) per event, and
        the events of a run grow with its flows, so a run's time grew with their square."""
        return f.remaining - f.rate * (self.engine.now - f.since)

    def _count(self, f: Flow) -> None:
        """Count ``f``'s bytes, and its links', up to now at the rates they had: before
        its rate changes or it ends."""
        now = self.engine.now
        f.remaining -= f.rate * (now - f.since)
        f.since = now
        for link in f.path:
            if link.since != now:
                link.carried += link.load * (now - link.since)
                link.since = now

    def _component(self) -> list[Flow]:
        """The flows whose rates may have changed: those sharing a link, transitively, with
        a stale link, and the followers of any of them (capped at an upstream's rate, they
        move with it). Max-min rates of flows that share no link are independent, so the
        rest keep theirs: a 4,096-GPU standalone run had 18 such groups on average, the
        largest 31 of 112 flows, and refilling all of them was most of its time.

        With ``depth`` set, the search stops ``depth`` links away from a stale link (a
        re-solved flow's followers are always taken in, whatever the depth): flows further
        out keep their rates, as fixed loads on the links the re-solved flows share with
        them (:meth:`_fill`), until a change of their own re-solves them. Where the search
        ends by itself first (every small network) this is the exact allocation; in a
        large, densely connected one it keeps a change's cost independent of the network's
        size: a 2,048-GPU broadcast re-solved 230 flows per change on average, exactly."""
        todo = list(self._dirty)
        self._dirty = {}
        links = set(todo)
        flows: dict[int, Flow] = {}
        followers = self._followers
        level = 0
        while todo and (self.depth is None or level < self.depth):
            level += 1
            nxt: list[Link] = []
            for link in todo:
                stack = list(link.flows.values())
                while stack:  # each flow, and its followers' chains whatever the depth
                    f = stack.pop()
                    if f.id in flows:
                        continue
                    flows[f.id] = f
                    if f.id in followers:  # (most flows have none: no call for them)
                        stack.extend(self._caught(f))
                    for lk in f.path:
                        if lk not in links:
                            links.add(lk)
                            nxt.append(lk)
            todo = nxt
        self.bounded = bool(todo)
        return sorted(flows.values(), key=lambda f: f.id)  # start order: as self.flows

    def _caught(self, f: Flow) -> list[Flow]:
        """``f``'s followers that have caught up with it: capped at its rate, they move
        with it, so a re-solve of ``f`` takes them in. One still catching up moves at its
        own links' rates, which a change of ``f``'s does not touch: only its catch-up
        time moves (:meth:`_timing`). Taking in every follower, with its chain and its
        links' neighbours, made a staged broadcast's re-solves 64 % larger."""
        followers = self._followers.get(f.id)
        if not followers:
            return []
        return [g for g in followers if self._has_caught_up(g)]

    def _has_caught_up(self, f: Flow) -> bool:
        """Whether follower ``f`` moves with its upstream now: within ``slack`` of its
        bytes, the very point its catch-up event is scheduled for (:meth:`_timing`). A
        test at twice that distance left a band in which a follower was capped by
        whichever re-solve took it in first, so that re-solving some flows and all of
        them disagreed."""
        up = f.upstream
        assert up is not None
        if up.id not in self.flows:
            return False
        return self._left(f) <= self._left(up) + f.slack * (1.0 + CATCH_TOLERANCE)

    @staticmethod
    def _cap(f: Flow) -> bool:
        """Cap a follower that has caught up with its upstream at the upstream's rate, or
        move its cap to that rate, which a filling may have moved (a cap only ever lowered
        once left a follower at its upstream's old rate, half its new one); whether it
        changed."""
        up = f.upstream
        assert f.cap is not None and up is not None
        cap = f.cap.capacity
        if (cap == INF and f.rate > up.rate * (1 + 1e-9)) or cap not in (INF, up.rate):
            f.cap.capacity = up.rate
            return True
        return False

    def _rates(self, flows: Sequence[Flow]) -> None:
        """Max-min rates of ``flows`` (every flow through their links among them), the
        followers among them uncapped first, then those that caught up with their upstream
        capped at its rate in rounds until no cap moves: each round settles at least one
        more level of a chain of followers. (Four rounds at most, until session 9, left the
        fifth level of a cut-through chain across the WAN filled past its cap, faster than
        its upstream.) No time passes between rounds, so who has caught up is decided once."""
        caught = []
        for f in flows:
            if f.cap is None:
                continue
            up = f.upstream
            assert up is not None
            if self._has_caught_up(f):
                # Capped from the start at the upstream's rate so far: most re-solves leave
                # it there, and then one filling settles them (from uncapped, every one
                # took two or more).
                f.cap.capacity = up.rate if up.rate > 0.0 else INF
                caught.append(f)
            else:  # (an upstream that ended, or one ahead: never capped)
                f.cap.capacity = INF
        for _ in range(len(caught) + 1):
            self._fill(flows)
            changed = False
            for f in caught:
                changed |= self._cap(f)
            if not changed:
                break

    def _reallocate(self) -> None:
        """Max-min fair rates of the stale flows (:meth:`_component`), capping flows that
        caught up with their upstream at its rate (in rounds until no cap moves: a chain of
        followers settles top-down); then schedule the next event: a completion, or a
        follower catching up.

        Both are kept in heaps with lazy deletion (an entry whose time is no longer its
        flow's is skipped): a flow's finish and catch-up times change only when its rate
        or its upstream's does, and then it is among the re-solved flows (a re-solve takes
        in the followers of every flow it takes in). Scanning every flow for the next
        event at every event made a run's time grow with the square of its size."""
        flows = self._component()
        now = self.engine.now
        before = [f.rate for f in flows]
        for f in flows:  # (:meth:`_count` inlined: a call per re-solved flow was 4 % of a run)
            rate = f.rate
            f.remaining -= rate * (now - f.since)
            f.since = now
            for link in f.path:
                if link.since != now:
                    link.carried += link.load * (now - link.since)
                    link.since = now
                link.load -= rate
        self._rates(flows)
        solved = {f.id for f in flows}
        for f, rate in zip(flows, before, strict=True):
            for link in f.path:
                link.load += f.rate
            if f.remaining <= 0:
                finish = f.since
            elif f.rate == rate:
                finish = f.finish  # (the same time; computed again, it moved by a rounding,
                # and each such move was a heap entry to push and to skip)
            else:
                finish = f.since + f.remaining / f.rate if f.rate > 0 else INF
            if finish != f.finish:
                f.finish = finish
                if finish < INF:
                    heapq.heappush(self._finishes, (finish, f.id, f))
            if f.upstream is not None:
                self._timing(f)
            for g in self._followers.get(f.id, ()):
                if g.id not in solved:
                    self._timing(g)  # still catching up with f: at f's new rate
        if self._next is not None:
            self._next.cancelled = True
            self._next = None
        wait = min(self._due(self._finishes, "finish"), self._due(self._catches, "catch")) - now
        if wait < INF:
            self._next = self.engine.later(max(0.0, wait), self._complete)

    def _timing(self, f: Flow) -> None:
        """When follower ``f`` catches up with its upstream at their current rates. (One
        still behind may hold a cap from when it had caught up: it moved slower than the
        cap since, so the cap does not bind, and its next re-solve lifts it.)"""
        up = f.upstream
        assert up is not None
        catch = INF
        assert f.cap is not None
        if up.id in self.flows and f.rate > up.rate and f.rate < f.cap.capacity:
            ahead = self._left(f) - self._left(up)  # (not capped, or its cap does not bind)
            catch = self.engine.now + max(0.0, ahead - f.slack) / (f.rate - up.rate)
        if catch != f.catch:
            f.catch = catch
            if catch < INF:
                heapq.heappush(self._catches, (catch, f.id, f))

    def _due(self, heap: list[tuple[float, int, Flow]], which: str) -> float:
        """The earliest time in ``heap`` that is still its flow's ``which`` (INF: none);
        entries overtaken since are dropped on the way."""
        while heap and not self._current(heap[0], which):
            heapq.heappop(heap)
        return heap[0][0] if heap else INF

    def _current(self, entry: tuple[float, int, Flow], which: str) -> bool:
        """Whether a heap entry still holds its live flow's ``which`` time."""
        at, fid, f = entry
        return fid in self.flows and getattr(f, which) == at

    def _pop_due(self, heap: list[tuple[float, int, Flow]], which: str, by: float) -> list[Flow]:
        """The live flows whose ``which`` time is at or before ``by``, off ``heap``, each
        once (a time that moved away and back left two entries), in start order."""
        due: dict[int, Flow] = {}
        while heap and heap[0][0] <= by:
            entry = heapq.heappop(heap)
            if self._current(entry, which):
                due[entry[1]] = entry[2]
        return [due[i] for i in sorted(due)]

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
        bounded = self.bounded
        mark = -stamp  # in this filling, not frozen yet (a flow not marked keeps its rate)
        touched: list[Link] = []
        for f in flows:
            f.frozen = mark
            f.rate = 0.0
            for link in f.path:
                if link.stamp != stamp:
                    link.stamp, link.left, link.active = stamp, link.capacity, 1
                    touched.append(link)
                else:
                    link.active += 1
        for link in touched:
            left = link.left
            if bounded:  # flows beyond the search keep their rates: fixed loads (``load``
                # holds theirs alone while a re-solve runs: see _reallocate)
                left = link.capacity - link.load
                if left < 0.0:
                    left = 0.0
                elif left > link.capacity:
                    left = link.capacity
                link.left = left
            if left < INF:  # (an uncapped follower's private link never fills)
                heap.append((left / link.active, link.name, link))
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
                if f.frozen != mark:
                    continue  # frozen already at another link (or not in this filling)
                f.frozen = stamp
                f.rate = share
                for lk in f.path:
                    lk.left -= share
                    lk.active -= 1
            link.active = 0

    def _complete(self) -> None:
        self._next = None
        now = self.engine.now
        for f in self._pop_due(self._catches, "catch", now + 1e-9):
            f.catch = INF
            for link in f.path:  # caught up: capped at the next filling
                self._dirty[link] = None
        finished = self._pop_due(self._finishes, "finish", now + 1e-6)  # (in start order)
        for f in finished:
            self._remove(f)
        self._changed(())  # at least the next event is to be scheduled again
        for f in finished:
            if not f.cancelled:
                f.done()
