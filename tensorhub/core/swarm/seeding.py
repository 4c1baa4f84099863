"""Super-seeding: the origin serves each chunk once before it serves any chunk twice.

The publisher (the *origin*) is the one node whose egress every fetcher would otherwise
share; a trainer wants to stop serving as soon as one full copy exists elsewhere. So the
origin hands each chunk out once, to whoever asks first, and answers later requests for a
chunk it already sent with the names of the nodes it sent it to (a redirect): they serve it
onward. A round-based rule ("a second copy once every chunk has gone out once") is not
enough: fetchers that all start together finish the first round within milliseconds, long
before any recipient could pass anything on. So a chunk goes out a second time only when a
recipient evidently did not pass it on: after its requests were refused for
``reserve_after``.

Across datacenters the origin also keeps the WAN clean: while nodes of its own datacenter
are fetching, a request from another datacenter is redirected to them, so each chunk
leaves the origin once and crosses the WAN from a fetcher — never back again.

Nothing here may starve a fetcher: a chunk whose recipients all died is served again at
once (when the caller can tell, from its membership view), and one refused for
``reserve_after`` (recipients slow or stuck; ten times longer when they are known alive: a
big version over a slow link takes a while to pass on) is served again. Time is an input
(any monotonic clock in the caller's unit), so the simulator and the real driver run this
same code.

Any other holder may run a short form of it (``origin=False``; DataPlaneConfig's
``every_holder_seeds``): the first node to hold a chunk would otherwise serve it to nearly
every other, which all ask it at once (rarest first). It redirects only while a chunk is
new here (see ``_spread``), leaves the WAN to the planner's owners, and always sends a
repeat copy while it has an idle upload slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

STUCK_FACTOR = 10
"""With liveness known, recipients that live get this many ``reserve_after`` to pass a
chunk on before it is sent again."""


@dataclass(frozen=True)
class SeedDecision:
    serve: bool
    holders: tuple[str, ...] = ()  # when refused: who got the chunk from us (ask them)


SERVE = SeedDecision(True)


class SuperSeeder:
    def __init__(
        self, num_chunks: int, reserve_after: float, serve_spare: bool = True, origin: bool = True
    ) -> None:
        self.num_chunks = num_chunks
        self.origin = origin  # else a fetched copy's holder (see the module docstring)
        self.reserve_after = reserve_after
        # Off where the origin's NIC carries other traffic (a trainer's collectives): then
        # it sends each chunk once, however idle its uplink looks from here.
        self.serve_spare = serve_spare
        self.served = [0] * num_chunks  # copies of each chunk handed out
        self.recipients: dict[int, list[str]] = {}
        self._refused_since: dict[int, float] = {}  # first refusal since it last went out
        self._first_sent: dict[int, float] = {}  # when each chunk first went out
        self.refusals = 0

    def decide(
        self,
        chunk: int,
        peer: str,
        now: float,
        *,
        remote: bool = False,
        local_busy: bool = False,
        alive: Callable[[str], bool] | None = None,
        spare: bool = False,
        behind: Callable[[str], bool] | None = None,
    ) -> SeedDecision:
        """May ``peer`` have ``chunk`` from us now? ``remote``: it is in another datacenter;
        ``local_busy``: other nodes of our datacenter are fetching this version; ``alive``:
        whether a node is alive (the membership view) and able to pass the chunk on to
        ``peer`` (for a peer of our datacenter, a recipient in another is not: it would send
        it back across the WAN), if known; ``spare``: our uplink has idle slots (a repeat
        copy then costs nothing a first copy needs: the origin's idle NIC is bandwidth the
        swarm would otherwise lack while the first copies still spread); ``behind``:
        whether a recipient is a relay link that fell behind, which passes nothing it lacks
        on to ``peer``: not a recipient to send it to (serve.past_laggards)."""
        got = self.recipients.get(chunk, [])
        if peer in got:
            return SERVE  # a retry: the copy we sent was lost or corrupted on the way
        if behind is not None and got:
            got = [g for g in got if not behind(g)]
        if not self.origin:
            return self._spread(chunk, got, now, alive, spare)
        if spare and got and not remote and self.serve_spare:
            return SERVE
        # Remote while our datacenter fetches: its fetchers carry the chunk across the WAN.
        if not got and not (remote and local_busy):
            return SERVE
        since = self._refused_since.setdefault(chunk, now)
        if got and alive is not None:
            if not any(alive(g) for g in got):
                return SERVE  # everyone we gave it to died: it must go out again
            # They live, so they will pass it on, however slowly (a big version, a slow
            # link): wait much longer before suspecting they are stuck.
            limit = self.reserve_after * STUCK_FACTOR
        else:
            limit = self.reserve_after
        if now - since >= limit:
            return SERVE  # whoever got it has not passed it on: do not starve anyone
        self.refusals += 1
        return SeedDecision(False, tuple(got))

    def _spread(
        self,
        chunk: int,
        got: list[str],
        now: float,
        alive: Callable[[str], bool] | None,
        spare: bool,
    ) -> SeedDecision:
        """A holder that is not the origin: a chunk's first copies spread from us only
        while it is new here, ``reserve_after`` from its first send; then, or with an idle
        slot, or with every recipient dead, we serve whoever asks. Redirecting for as long
        as the origin does (recipients alive: ten times that) sent the askers of a late
        fetch on to the next holder, often the origin itself: simulated, the standalone
        step's trainer served until 9.6 s instead of 7.0 s, its worst rollout stalled
        10.67x its bound instead of 8.79x (with this window: 5.8 s, 8.76x). The WAN is
        the planner's owners' to cross: no remote rule here."""
        first = self._first_sent.get(chunk)
        if first is None or spare or now - first >= self.reserve_after:
            return SERVE
        if alive is not None and not any(alive(g) for g in got):
            return SERVE
        self.refusals += 1
        return SeedDecision(False, tuple(got))

    def unsent(self, chunk: int, peer: str) -> None:
        """The copy of ``chunk`` meant for ``peer`` did not go (the peer gave the request
        up before it was sent, or a stream of it was cut): ``peer`` is no recipient to
        send others to. Its count of copies handed out drops; when and how the chunk
        first went out stays (the redirect window is not reopened)."""
        got = self.recipients.get(chunk)
        if got is not None and peer in got:
            got.remove(peer)
            self.served[chunk] -= 1

    def sent(self, chunk: int, peer: str, now: float) -> None:
        """We are sending ``chunk`` to ``peer`` (after a SERVE decision)."""
        got = self.recipients.setdefault(chunk, [])
        if peer in got:
            return
        got.append(peer)
        self._first_sent.setdefault(chunk, now)
        self._refused_since.pop(chunk, None)
        self.served[chunk] += 1


def holder_seeder(
    seeder: SuperSeeder | None, num_chunks: int, spread_after: float | None
) -> SuperSeeder | None:
    """The seeder a holder answers a request with: its own (an origin's, or one made
    earlier); else, with ``spread_after`` (``reserve_after`` where DataPlaneConfig's
    ``every_holder_seeds`` is on), a fetched copy's, made on its first request; else none.
    The node's PeerHandler and the simulator both ask here."""
    if seeder is None and spread_after is not None:
        return SuperSeeder(num_chunks, spread_after, origin=False)
    return seeder
