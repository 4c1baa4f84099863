"""The serve core: how a holder answers a chunk request, and the super-seeding context.

The node's PeerHandler and the simulator's holders both answer through these functions."""

from __future__ import annotations

import pytest

from tensorhub.core.swarm import SeedDecision
from tensorhub.core.swarm.serve import (
    SeedContext,
    ServeDecision,
    Verdict,
    past_laggards,
    seed_context,
    serve_decision,
)

SERVE, REFUSE = SeedDecision(True), SeedDecision(False, ("x", "y"))


@pytest.mark.parametrize(
    ("have", "incoming", "admit", "seed", "cut_through", "want"),
    [
        (True, False, True, None, False, ServeDecision(Verdict.SERVE)),
        (False, False, True, None, False, ServeDecision(Verdict.NO_CHUNK)),
        (False, True, True, None, False, ServeDecision(Verdict.PARK)),
        # cut through: asked for, its bytes not landing yet: parked until they land
        (False, True, True, None, True, ServeDecision(Verdict.PARK)),
        (False, False, True, None, True, ServeDecision(Verdict.NO_CHUNK)),
        (True, False, False, None, False, ServeDecision(Verdict.BUSY)),
        (True, False, True, REFUSE, False, ServeDecision(Verdict.REDIRECT, ("x", "y"))),
        (True, False, True, SERVE, False, ServeDecision(Verdict.SERVE)),
        (True, False, False, REFUSE, False, ServeDecision(Verdict.BUSY)),  # busy comes first
    ],
)
def test_the_verdicts_in_their_order(
    have: bool,
    incoming: bool,
    admit: bool,
    seed: SeedDecision | None,
    cut_through: bool,
    want: ServeDecision,
) -> None:
    asked: list[str] = []

    def admit_fn() -> bool:
        asked.append("admit")
        return admit

    def seed_fn() -> SeedDecision:
        asked.append("seed")
        assert seed is not None
        return seed

    got = serve_decision(
        have=have,
        incoming=incoming,
        admit=admit_fn,
        seed=seed_fn if seed is not None else None,
        cut_through=cut_through,
    )
    assert got == want
    # admit (which counts refusals) and the seeder are asked only when they decide
    if want.verdict in (Verdict.NO_CHUNK, Verdict.PARK):
        assert asked == []
    if want.verdict is Verdict.BUSY:
        assert asked == ["admit"]


@pytest.mark.parametrize(
    ("cut_through", "admit", "want"),
    [
        (True, True, Verdict.SERVE),  # served while it lands
        (True, False, Verdict.BUSY),  # as any upload, within the upload limits
        (False, True, Verdict.PARK),  # without cut-through, landing bytes wait for the whole
    ],
)
def test_a_chunk_whose_bytes_are_landing_is_served_only_cutting_through(
    cut_through: bool, admit: bool, want: Verdict
) -> None:
    got = serve_decision(
        have=False, incoming=True, admit=lambda: admit, cut_through=cut_through, landing=True
    )
    assert got.verdict is want


DC = {"a1": "A", "a2": "A", "b1": "B", "b2": "B"}


def context(peer: str, others: bool = True, dead: frozenset[str] = frozenset()) -> SeedContext:
    return seed_context(
        "A", DC.get(peer), lambda: others, DC.get, lambda n: n in DC and n not in dead
    )


def test_a_remote_asker_counts_our_members_and_its_own_recipients() -> None:
    ctx = context("b1")
    assert ctx.remote and ctx.local_busy and ctx.can_pass_on is not None
    # A remote asker may get a chunk from any live recipient: ours carry it across.
    assert ctx.can_pass_on("a2") and ctx.can_pass_on("b2")
    assert not context("b1", others=False).local_busy
    dead = context("b1", dead=frozenset({"a2"})).can_pass_on
    assert dead is not None and not dead("a2")


def test_a_local_asker_is_not_sent_back_across_the_wan() -> None:
    ctx = context("a2")
    assert not ctx.remote and not ctx.local_busy and ctx.can_pass_on is not None
    assert ctx.can_pass_on("a1") and not ctx.can_pass_on("b1")


def test_an_unknown_asker_gets_the_plain_liveness_view() -> None:
    ctx = context("stranger")
    assert not ctx.remote and not ctx.local_busy
    assert ctx.can_pass_on is not None and ctx.can_pass_on("b1") and not ctx.can_pass_on("zz")


@pytest.mark.parametrize(
    ("have", "incoming", "landing", "want"),
    [
        (False, True, False, Verdict.BUSY),  # asked for from the tail: not parked here
        (False, False, False, Verdict.BUSY),
        (False, True, True, Verdict.SERVE),  # its bytes are landing now: they go on
        (True, False, False, Verdict.SERVE),  # what it holds it still serves
    ],
)
def test_a_lagging_relay_link_parks_nothing(
    have: bool, incoming: bool, landing: bool, want: Verdict
) -> None:
    """A link that fell behind relays from the chain's tail: a request parked for a chunk
    it lacks would wait for the chunk to come round the chain through the asker itself."""
    got = serve_decision(
        have=have,
        incoming=incoming,
        admit=lambda: True,
        cut_through=True,
        landing=landing,
        lagging=True,
    )
    assert got.verdict is want


@pytest.mark.parametrize(
    ("have", "incoming", "landing", "want"),
    [
        (False, True, False, Verdict.PARK),  # asked for, not landing yet: wait for it
        (False, True, True, Verdict.SERVE),  # landing: cut through
        (False, False, False, Verdict.NO_CHUNK),
        (True, False, False, Verdict.SERVE),
    ],
)
def test_a_lagging_relay_link_parks_for_a_laggard_after_it(
    have: bool, incoming: bool, landing: bool, want: Verdict
) -> None:
    """A laggard that relays from us (the laggards chain behind the tail) gets what any
    link's downstream gets: what we lack comes to us first, from the link before us."""
    got = serve_decision(
        have=have,
        incoming=incoming,
        admit=lambda: True,
        cut_through=True,
        landing=landing,
        lagging=True,
        asker_lagging=True,
    )
    assert got.verdict is want


def test_a_relay_link_that_fell_behind_passes_nothing_on_to_one_that_did_not() -> None:
    """It answers such an asker "busy" for whatever it lacks (serve_decision), so an origin
    sends the asker elsewhere, or serves it; a laggard asker may still be sent to it."""
    ctx = SeedContext(False, False, lambda g: g != "dead")
    lagging = {"slow"}.__contains__
    fresh = past_laggards(ctx, False, lagging)
    assert fresh.behind is lagging and fresh.can_pass_on is ctx.can_pass_on
    assert past_laggards(ctx, True, lagging) is ctx
    bare = past_laggards(SeedContext(False, False, None), False, lagging)
    assert bare.can_pass_on is None and bare.behind is lagging


@pytest.mark.parametrize(
    ("have", "landing", "lagging", "want"),
    [
        (False, False, False, Verdict.PARK),  # we ask for it first: wait here for it
        (False, True, False, Verdict.SERVE),  # landing: cut through, as ever
        (True, False, False, Verdict.SERVE),
        (False, False, True, Verdict.BUSY),  # a laggard parks nothing for a link that is not
    ],
)
def test_a_fetch_that_holds_nothing_yet_parks_a_request_for_a_first_chunk(
    have: bool, landing: bool, lagging: bool, want: Verdict
) -> None:
    """At the start of a fetch a link's first requests reach its upstream before that
    upstream asked its own: parked rather than "no chunk" and a retry 20-30 ms later,
    each hop of the chain forming trails by a piece, not by a retry and a chunk."""
    got = serve_decision(
        have=have,
        incoming=False,
        admit=lambda: True,
        cut_through=True,
        landing=landing,
        lagging=lagging,
        starting=True,
    )
    assert got.verdict is want
