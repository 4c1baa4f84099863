"""One fetch's request lifecycle, pure: what the node's driver and the simulator both run.

The :class:`ChunkPlanner` decides which chunk to ask of whom. Around it, a fetch needs
more policy: how each way a request can end maps onto the planner (a corrupt chunk is a
strike, "busy" a short block, a lost connection drops the source), which copies lose when
one lands (endgame), when a chunk is no longer on its way (so a peer parked on it hears
"not here"), what a hung source costs (everything in flight to it), and how the planner's
ticks follow time. The node and the simulator used to write that twice, differently; now
both feed a :class:`FetchSession` events and perform the actions it returns, in the style
of etcd/raft's ``RawNode`` (inputs in, a list of things to do out; no I/O, no clock, no
randomness of its own: time is an argument and the planner's RNG is given).

A request's life is an explicit table (after h11's ``_state.py``)::

    ISSUED ──receiving──▶ RECEIVING
    ISSUED | RECEIVING ──verified──▶ VERIFIED
    ISSUED | RECEIVING ──failed────▶ FAILED
    ISSUED | RECEIVING ──abandon───▶ ABANDONED

VERIFIED, FAILED and ABANDONED are final: an event for a request in a final state (an
endgame loser whose reply still arrived, a reply after a timeout gave up on it) changes
nothing and returns no action; any other pair is a bug and raises.
"""

from __future__ import annotations

import enum
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from .planner import ChunkPlanner, DcView, Failure, Request


class Phase(enum.Enum):
    ISSUED = "issued"  # sent (or about to be), nothing back yet
    RECEIVING = "receiving"  # its payload is arriving
    VERIFIED = "verified"  # it landed and matched the manifest's digest
    FAILED = "failed"  # the source answered otherwise, or the connection broke
    ABANDONED = "abandoned"  # we gave up on it: another copy won, or its source hung/died


FINAL = frozenset({Phase.VERIFIED, Phase.FAILED, Phase.ABANDONED})

DEAD_DOUBT_S = 1.0
"""A dead verdict on a holder whose payload began to arrive this recently waits this long
for another payload from it before it is carried out (:meth:`FetchSession.source_dead`)."""

_NEXT: dict[tuple[Phase, str], Phase] = {
    (Phase.ISSUED, "receiving"): Phase.RECEIVING,
    (Phase.ISSUED, "verified"): Phase.VERIFIED,
    (Phase.RECEIVING, "verified"): Phase.VERIFIED,
    (Phase.ISSUED, "failed"): Phase.FAILED,
    (Phase.RECEIVING, "failed"): Phase.FAILED,
    (Phase.ISSUED, "abandon"): Phase.ABANDONED,
    (Phase.RECEIVING, "abandon"): Phase.ABANDONED,
}


class Outcome(enum.Enum):
    """How a request ended other than verified; the value names it in ``trouble``."""

    CORRUPT = "corrupt"  # the bytes did not match the manifest's digest
    REDIRECTED = "redirected"  # an origin sent the chunk out already: ask those holders
    WITHDRAWN = "withdrawn"  # the source does not hold the version (let go, stale hint)
    NOT_YET = "no_chunk"  # the source lacks the chunk: not verified there yet, stale hint
    BUSY = "busy"  # the source's upload queue is full
    LOST = "holder lost"  # the connection broke, or the source died
    FAILED = "failed"  # anything else the source answered


_FAILURE: dict[Outcome, str] = {
    Outcome.CORRUPT: Failure.CORRUPT,
    Outcome.REDIRECTED: Failure.REFUSED,
    Outcome.WITHDRAWN: Failure.GONE,
    Outcome.NOT_YET: Failure.MISSING,
    Outcome.BUSY: Failure.REFUSED,
    Outcome.LOST: Failure.ERROR,
    Outcome.FAILED: Failure.ERROR,
}


@dataclass(frozen=True)
class Send:
    """Ask ``request.source`` for ``request.chunk`` (into scratch if a duplicate)."""

    request: Request


@dataclass(frozen=True)
class Abandon:
    """Stop ``request`` now: none of its bytes may land in the destination any more."""

    request: Request


@dataclass(frozen=True)
class Settle:
    """No copy of ``chunk`` is on its way any more: it is held now (``held``), or it is
    not coming yet, and a peer waiting for it here must hear so."""

    chunk: int
    held: bool


@dataclass(frozen=True)
class Behind:
    """Tell ``source``, our upstream and the chain's head, that it is slower than the
    origin could feed us (``headcheck``): it moves to the chain's tail, and we relay from
    the origin (the node's ``Behind`` message)."""

    source: str


Action = Send | Abandon | Settle | Behind


class Input(NamedTuple):
    """One input a session was given, and what it returned (see :func:`replay`)."""

    method: str
    args: tuple[Any, ...]
    returned: Any


P = ParamSpec("P")
R = TypeVar("R")


def _input(
    method: Callable[Concatenate[FetchSession, P], R],
) -> Callable[Concatenate[FetchSession, P], R]:
    """Mark a method as one of the session's inputs: recorded when the session records."""

    @functools.wraps(method)
    def recorded(self: FetchSession, /, *args: P.args, **kwargs: P.kwargs) -> R:
        out = method(self, *args, **kwargs)
        if self.record is not None:
            assert not kwargs, "inputs are recorded positionally"
            # (lists are copied: a driver may go on changing the one it passed)
            frozen = tuple(tuple(a) if isinstance(a, list) else a for a in args)
            self.record.append(Input(method.__name__, frozen, out))
        return out

    return recorded


class FetchSession:
    """Requests of one fetch, from issue to their end, driving one :class:`ChunkPlanner`.

    Everything the planner learns arrives through the session's inputs (the methods
    marked ``@_input``): request outcomes, time, and the holder view's news. With
    ``record`` a list, each input and what it returned is appended to it, so a fetch run
    by the node or by the simulator can be replayed (:func:`replay`) and compared."""

    def __init__(self, planner: ChunkPlanner, record: list[Input] | None = None) -> None:
        self.planner = planner
        self.record = record
        self.phase: dict[Request, Phase] = {}
        """Requests not yet ended (a final phase leaves this map)."""
        self.issued_at: dict[Request, float] = {}
        self._heard: dict[str, float] = {}
        """When each source's latest payload began to arrive: what :meth:`expire` measures
        from, with the issue time of the source's oldest request in flight."""
        self._doubted: dict[str, tuple[float, float]] = {}
        """Sources declared dead while still sending: (when, their latest payload's start
        then); see :meth:`source_dead`."""
        self.trouble: Counter[str] = Counter()
        """Why requests failed, by name: for the slow-fetch warning and the stuck error."""
        self._copies: Counter[int] = Counter()  # chunk → requests for it not yet ended

    # -- the holder view -----------------------------------------------------------------------

    @_input
    def set_source(
        self,
        name: str,
        tier: int,
        chunks: Iterable[int] | None,
        origin: bool = False,
        lagging: bool = False,
    ) -> None:
        """A holder of this version, as the holder view has it (see ChunkPlanner)."""
        if chunks is not None and not isinstance(chunks, range | list | tuple):
            chunks = sorted(chunks)  # (a recording holds values, not iterators)
        self.planner.set_source(name, tier, chunks, origin=origin, lagging=lagging)

    @_input
    def set_lagged_before(self, names: AbstractSet[str]) -> None:
        """Links that fell behind in their last fetch of this key: the chain's tail from
        the start (ChunkPlanner.set_lagged_before)."""
        self.planner.set_lagged_before(names)

    @_input
    def add_chunk(self, name: str, chunk: int, tier: int | None = None) -> None:
        """A source announced ``chunk`` (or an origin said it sent it there)."""
        self.planner.add_chunk(name, chunk, tier)

    @_input
    def add_chunks(self, name: str, chunks: Sequence[int]) -> None:
        """A source announced it holds ``chunks`` (a peer's ``Have``: ChunkPlanner.add_chunks)."""
        self.planner.add_chunks(name, chunks)

    @_input
    def seen_all(self, names: Sequence[str]) -> None:
        """The holder view lists ``names`` as alive now (one input for a whole listing)."""
        self.planner.seen_all(names)

    @_input
    def seen_all_but(self, dead: AbstractSet[str]) -> None:
        """The holder view lists every source but ``dead`` as alive now."""
        self.planner.seen_all_but(dead)

    @_input
    def source_gone(self, name: str) -> None:
        """The holder view lists ``name`` no more: it let go of the version (unpublished).
        Plan without it; what is in flight from it stays booked and goes on (its uploads
        drain): a chunk asked of it is not asked again as a first copy, and a twin that
        lands first abandons it (forgotten, two first copies wrote into the chunk's memory,
        the gone source's still writing after the other was verified)."""
        self.planner.unlist_source(name)

    @_input
    def suspend(self, name: str, ticks: int) -> None:
        """Ask ``name`` for nothing new for ``ticks`` (gossip suspects it)."""
        self.planner.suspend(name, ticks)

    @_input
    def set_dc_fetchers(self, fetchers: Sequence[str], members: Sequence[str] = ()) -> None:
        """Our datacenter's fetchers of this version, and its other live members."""
        self.planner.set_dc_fetchers(list(fetchers), list(members))

    @_input
    def set_dc_view(self, view: DcView) -> bool:
        """The same, from a view built once for the whole datacenter; whether chunks that
        waited on an owner's turn look again (a call now may ask for them)."""
        return self.planner.set_dc_view(view)

    # -- time ----------------------------------------------------------------------------------

    @_input
    def advance(self, ticks: int, every: int = 0) -> bool:
        """Catch the planner up to tick ``ticks``; whether a multiple of ``every`` was
        passed on the way (the driver then refreshes holder hints)."""
        due = False
        while self.planner.now < ticks:
            self.planner.tick()
            due = due or bool(every and self.planner.now % every == 0)
        return due

    # -- inputs --------------------------------------------------------------------------------

    @_input
    def stalled(self) -> None:
        """The driver did not run for a while (its process had no CPU): see
        ChunkPlanner.stalled. The simulator models no CPU and never says so."""
        self.planner.stalled()

    @_input
    def requests(self, now: float) -> list[Action]:
        """New requests to send now, within the planner's limits."""
        out = self._take_back()
        sends = self.planner.next_requests()
        # What planning itself took back (a lag verdict gives back what we asked our
        # upstream) and asked again at once, an equal Request, goes on as it was: sent
        # anew, it took the live one's phase, the driver cancelled the new one's task and
        # the old one's landed unknown to the session (bench/linerate.py --case slow: a
        # KeyError failed the fetch). The rest end after the sends, as they would at the
        # next call: a chunk asked of someone else meanwhile is not settled as missing.
        taken = self.planner.taken_back()
        again = set(taken).intersection(sends)
        # (Behind first: it tells the origin too, which must hear it before our next
        # requests, or it sends us back to the slow head for them.)
        out += [Behind(name) for name in self.planner.behind()]
        for r in sends:
            if r in again:
                continue
            self.phase[r] = Phase.ISSUED
            self.issued_at[r] = now
            self._copies[r.chunk] += 1
            out.append(Send(r))
        out += self._abandon_all(r for r in taken if r not in again)
        return out

    @_input
    def told_behind(self) -> bool:
        """The link after us found us slower than the origin could feed it (its
        ``Behind``): see ChunkPlanner.told_behind. Whether we moved to the chain's tail."""
        return self.planner.told_behind()

    @_input
    def receiving(self, r: Request, now: float) -> None:
        """``r``'s payload began to arrive at ``now``: its source is not hung, however long
        the request queued there (a slow link, a deep upload queue); the timeout starts
        again for the payload itself."""
        if self._step(r, "receiving"):
            self._heard[r.source] = now

    @_input
    def verified(self, r: Request) -> list[Action]:
        """``r`` landed and matched: every other copy of its chunk loses."""
        if not self._step(r, "verified"):
            return []
        losers = self.planner.received(r.chunk, r.source)
        out: list[Action] = [a for q in losers if (a := self._abandon(q)) is not None]
        return out + self._end(r, held=True)

    @_input
    def failed(
        self, r: Request, outcome: Outcome, holders: Sequence[tuple[str, int]] = ()
    ) -> list[Action]:
        """``r`` ended without its chunk. ``holders``: where a redirect says the chunk went,
        as (address, tier) of those we can reach."""
        if not self._step(r, "failed"):
            return []
        self.trouble[outcome.value] += 1
        p = self.planner
        out: list[Action] = []
        if outcome is Outcome.LOST:
            # The holder is gone: its chunks return to the pool, so every other request
            # to it ends here too. Left running, one whose bytes still arrived (a request
            # that failed alone, its connection up) would land beside the first copy the
            # pool asks of someone else, in the same destination.
            out = self._forget_source(r.source)
        p.failed(r.chunk, r.source, _FAILURE[outcome])
        for addr, tier in holders:
            p.add_chunk(addr, r.chunk, tier)
        return out + self._end(r, held=False) + self._take_back()

    @_input
    def source_dead(self, source: str, now: float) -> list[Action]:
        """The holder view declared ``source`` dead: abandon what is in flight to it and
        forget it (a hung process keeps its connections open, so nothing else would tell).

        Unless a payload from it began to arrive within ``DEAD_DOUBT_S`` of ``now``: then
        the verdict waits, and :meth:`expire` carries it out only if no new payload from
        the source begins within that window. A failure detector on an overloaded host
        declares live members dead, and dropping a relay's upstream that way starves its
        whole chain (a 3.2x fan-out run of session 16 logged one "holder dead" at the
        chain's head, which then took its chunks from its own downstream); a live source
        keeps starting payloads, a hung one does not."""
        heard = self._heard.get(source)
        if heard is not None and now - heard < DEAD_DOUBT_S:
            self.trouble["holder dead, doubted"] += 1
            self._doubted[source] = (now, heard)
            return []
        return self._drop_dead(source)

    def heard_from(self, source: str, now: float) -> bool:
        """Whether a payload from ``source`` began within ``DEAD_DOUBT_S`` of ``now``: it is
        alive, whatever the failure detector says (see :meth:`source_dead`). Its driver
        does not suspend such a suspect: a doubted verdict is settled by the payloads that
        begin after it, and a suspended source is asked for none, so the verdict was
        carried out on a source that was sending all along (likely what broke one round of
        bench/linerate.py in session 25: the chain's head counted a doubted and a carried-
        out verdict, took its chunks from the swarm, and the round took 3.0x one copy)."""
        heard = self._heard.get(source)
        return heard is not None and now - heard < DEAD_DOUBT_S

    def _drop_dead(self, source: str) -> list[Action]:
        self._doubted.pop(source, None)
        self.trouble["holder dead"] += 1
        return self._forget_source(source)

    def _forget_source(self, source: str) -> list[Action]:
        """``source`` is gone (dead, or its connection lost): every request in flight to
        it ends, and the planner plans without it (its chunks return to the pool)."""
        out = self._abandon_all([q for q in self.phase if q.source == source])
        self.planner.remove_source(source)
        return out

    def _doubts_settled(self, now: float) -> list[Action]:
        """Dead verdicts that waited: dropped if the source began no payload since, after
        ``DEAD_DOUBT_S``; forgotten if it did (it is alive)."""
        out: list[Action] = []
        for source, (said, heard) in list(self._doubted.items()):
            if self._heard.get(source, heard) > heard or source not in self.planner.sources:
                del self._doubted[source]  # alive, or gone another way (a lost connection)
            elif now - said >= DEAD_DOUBT_S:
                out += self._drop_dead(source)
        return out

    @_input
    def expire(self, now: float, timeout: float) -> list[Action]:
        """Requests unanswered for ``timeout``: their source hangs (alive to TCP, sending
        nothing), so everything in flight to it is stuck behind them; ask others for all
        of it, and leave the source alone a while. First, dead verdicts that waited on
        their doubt (:meth:`source_dead`) are carried out or forgotten."""
        out: list[Action] = self._doubts_settled(now) if self._doubted else []
        quiet: dict[str, float] = {}  # source → since when it has sent us nothing
        for r, t in self.issued_at.items():
            since = max(t, self._heard.get(r.source, t))
            quiet[r.source] = min(quiet.get(r.source, since), since)
        hung = {source for source, t in quiet.items() if now - t > timeout}
        for q in [q for q in self.phase if q.source in hung]:
            self.trouble["timed out"] += 1
            out += self._abandon_all([q])
            self.planner.failed(q.chunk, q.source, Failure.TIMEOUT)
        return out

    @_input
    def abandon_all(self) -> list[Action]:
        """The fetch ends (failed, cancelled): nothing may land after this."""
        return self._abandon_all(list(self.phase))

    # -- bookkeeping ---------------------------------------------------------------------------

    def _step(self, r: Request, event: str) -> bool:
        """Move ``r`` on ``event``; False if it already ended (the event is moot)."""
        phase = self.phase.get(r)
        if phase is None:
            return False  # ended: its phase was final
        nxt = _NEXT.get((phase, event))
        if nxt is None:
            raise RuntimeError(f"request {r} cannot go {event!r} from {phase.value}")
        if nxt in FINAL:
            del self.phase[r]
            self.issued_at.pop(r, None)
        else:
            self.phase[r] = nxt
        return True

    def _abandon(self, r: Request) -> Action | None:
        """``r`` loses (its planner accounting was done by the caller): the driver stops it.
        Its chunk's settling is left to whoever ends the chunk's last copy."""
        if not self._step(r, "abandon"):
            return None
        self._copies[r.chunk] -= 1
        return Abandon(r)

    def _abandon_all(self, requests: Iterable[Request]) -> list[Action]:
        out: list[Action] = []
        for r in list(requests):
            a = self._abandon(r)
            if a is not None:
                out.append(a)
                out += self._settle_if_last(r.chunk)
        return out

    def _take_back(self) -> list[Action]:
        """Requests the planner took back (a relay upstream that refused us: the rest of
        what we asked it, see ChunkPlanner.taken_back) end now, before any request is
        issued again (the same request may be issued anew) and before their replies can
        arrive: the planner's books already let go of them."""
        return self._abandon_all(self.planner.taken_back())

    def _end(self, r: Request, held: bool) -> list[Action]:
        self._copies[r.chunk] -= 1
        if held:
            self._copies.pop(r.chunk, None)
            return [Settle(r.chunk, True)]
        return self._settle_if_last(r.chunk)

    def _settle_if_last(self, chunk: int) -> list[Action]:
        if self._copies[chunk] > 0:
            return []
        del self._copies[chunk]
        if self.planner.have[chunk]:
            return []  # settled when it was verified
        return [Settle(chunk, False)]

    def copies(self, chunk: int) -> int:
        """Requests for ``chunk`` not yet ended (0: it is not on its way here)."""
        return self._copies.get(chunk, 0)


def replay(record: Sequence[Input], planner: ChunkPlanner) -> list[tuple[Input, Any]]:
    """Feed a recorded session's inputs to a new session over ``planner`` (built as the
    recorded one was: same name, size, seed and config); returns each input where it
    decided otherwise, with what it returned (none: the recorded decisions were the
    core's alone, whichever driver ran it)."""
    session = FetchSession(planner)
    out = []
    for i in record:
        got = getattr(session, i.method)(*i.args)
        if got != i.returned:
            out.append((i, got))
    return out
