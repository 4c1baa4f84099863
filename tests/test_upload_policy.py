"""The serving side's policies: super-seeding (the origin) and upload slots."""

from __future__ import annotations

import random
from collections import Counter, deque

from hypothesis import given
from hypothesis import strategies as st

from tensorhub.core.swarm import SuperSeeder, UploadSlots
from tensorhub.dataplane.upload_grants import UploadGrants


def test_origin_sends_each_chunk_once_and_redirects_to_the_recipient() -> None:
    s = SuperSeeder(4, reserve_after=10)
    assert s.decide(0, "a", now=0).serve
    s.sent(0, "a", now=0)
    d = s.decide(0, "b", now=1)
    assert not d.serve and d.holders == ("a",)
    assert s.decide(1, "b", now=1).serve  # an unsent chunk goes to whoever asks first
    assert s.decide(0, "a", now=2).serve  # a retry by the recipient (its copy was lost)


def test_a_copy_that_never_went_names_no_recipient() -> None:
    """A reply given up before it was sent (Cancel) or cut mid-stream: the asker does not
    hold the chunk, so later askers are not sent to it."""
    s = SuperSeeder(4, reserve_after=10)
    s.sent(0, "a", now=0)
    s.sent(0, "b", now=0)
    s.unsent(0, "a")
    assert s.decide(0, "c", now=1).holders == ("b",)
    s.unsent(0, "b")
    s.unsent(0, "b")  # (twice, or for a peer never sent to: no change)
    s.unsent(1, "a")
    assert s.decide(0, "c", now=2).serve and s.served == [0, 0, 0, 0]


def test_a_recipient_that_fell_behind_is_no_one_to_send_an_asker_to() -> None:
    s = SuperSeeder(4, reserve_after=10)
    s.sent(0, "slow", now=0)
    s.sent(1, "slow", now=0)
    s.sent(1, "ok", now=0)
    behind = {"slow"}.__contains__
    assert s.decide(0, "b", now=1, behind=behind).serve  # its only recipient lags
    assert s.decide(1, "b", now=1, behind=behind).holders == ("ok",)
    assert s.decide(0, "b", now=1).holders == ("slow",)  # (not known to lag)


def test_a_chunk_nobody_passed_on_is_sent_again_after_reserve_after() -> None:
    s = SuperSeeder(2, reserve_after=10)
    s.sent(0, "a", now=0)
    assert not s.decide(0, "b", now=5).serve  # refusals start the clock
    assert not s.decide(0, "b", now=14).serve
    assert s.decide(0, "b", now=15).serve  # "a" died or is slow: do not starve "b"
    s.sent(0, "b", now=15)
    assert not s.decide(0, "c", now=16).serve  # the clock restarts after a new copy


def test_remote_requests_wait_for_the_local_datacenter() -> None:
    s = SuperSeeder(2, reserve_after=10)
    d = s.decide(0, "far", now=0, remote=True, local_busy=True)
    assert not d.serve and d.holders == ()  # not even a first copy: locals carry it over
    s.sent(0, "near", now=1)
    assert s.decide(0, "far", now=2, remote=True, local_busy=True).holders == ("near",)
    assert s.decide(1, "far", now=2, remote=True, local_busy=False).serve  # no locals


@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 8))
def test_property_one_copy_per_chunk_unless_a_refusal_outlived_reserve_after(
    seed: int, chunks: int, peers: int
) -> None:
    """Random requests over time: a chunk's second copy only ever follows a refusal of at
    least ``reserve_after``; and every request is served within that bound (no starvation)."""
    rng = random.Random(seed)
    reserve = 5
    s = SuperSeeder(chunks, reserve_after=reserve)
    first_refusal: dict[tuple[int, str], int] = {}
    for now in range(200):
        c, p = rng.randrange(chunks), f"p{rng.randrange(peers)}"
        had = list(s.recipients.get(c, []))
        d = s.decide(c, p, now)
        if d.serve:
            if had and p not in had:
                assert any(now - t >= reserve for (cc, _), t in first_refusal.items() if cc == c)
            s.sent(c, p, now)
            if p not in had:  # a new copy (not a recipient's retry) restarts the clock
                first_refusal = {k: t for k, t in first_refusal.items() if k[0] != c}
        else:
            assert set(d.holders) == set(had) and had
            first_refusal.setdefault((c, p), now)
            assert now - first_refusal[(c, p)] < reserve + 1


def test_slots_bound_concurrent_uploads_and_unchoke_round_robin() -> None:
    u = UploadSlots(slots=2, max_waiting=100)
    assert u.request("greedy", 1) and u.request("greedy", 2)  # slots free: go at once
    for t in range(3, 13):
        assert not u.request("greedy", t)  # a greedy peer queues ten
    assert not u.request("modest", 100)
    granted = [p for _ in range(4) for p, _t in u.release("greedy")]
    # The modest peer is not stuck behind the greedy one's queue: it gets the next-but-one.
    assert "modest" in granted[:2] and u.active == 2


def test_busy_when_the_queue_is_full_and_cancel_frees_a_place() -> None:
    u = UploadSlots(slots=1, max_waiting=2)
    assert u.request("a", 0)
    assert u.admit() and not u.request("a", 1)
    assert u.admit() and not u.request("b", 2)
    assert not u.admit() and u.refused == 1
    u.cancel("a", 1)
    assert u.admit()
    assert u.release("a") == [("b", 2)]


def test_a_rack_mate_may_wait_longer_than_a_farther_requester() -> None:
    u = UploadSlots(slots=1, max_waiting=1, near_waiting=2)
    assert u.request("a", 0)
    assert u.admit() and not u.request("far", 1)
    assert not u.admit() and u.admit(near=True)  # only a rack-mate still gets in line
    assert not u.request("mate", 2)
    assert not u.admit(near=True) and u.refused == 2
    assert UploadSlots(max_waiting=3).near_waiting == 3  # by default, one limit for all


async def test_uploads_ask_who_is_near() -> None:
    up = UploadGrants(slots=1, max_waiting=0, near_waiting=1, near={"mate"}.__contains__)
    up.request("a")
    assert not up.admit("far") and up.admit("mate")
    blind = UploadGrants(slots=1, max_waiting=0, near_waiting=1)
    blind.request("a")
    assert not blind.admit("mate")  # where nodes are is unknown: one limit for all


@given(st.integers(0, 2**32 - 1))
def test_property_slots_fair_share(seed: int) -> None:
    """Under random arrivals, while peers keep requests queued, grants alternate between
    them: no backlogged peer gets two slots while another backlogged peer waits."""
    rng = random.Random(seed)
    u = UploadSlots(slots=3, max_waiting=10_000)
    peers = ["a", "b", "c"]
    ticket = 0
    running: deque[str] = deque()  # who holds a slot, oldest first
    for p in peers:
        for _ in range(rng.randrange(5, 30)):
            if u.request(p, ticket):
                running.append(p)
            ticket += 1
    grants: list[str] = []
    while u.waiting:
        got = [p for p, _t in u.release(running.popleft())]
        running.extend(got)
        grants += got
        assert u.active <= u.slots
    # Count grants per peer while all three still had work: they differ by at most one.
    window = grants[: 3 * min(Counter(grants).values())]
    counts = Counter(window)
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_known_live_recipients_get_longer_and_dead_ones_none() -> None:
    s = SuperSeeder(2, reserve_after=10)
    s.sent(0, "a", now=0)
    alive = {"a": True}
    assert not s.decide(0, "b", now=1, alive=alive.__getitem__).serve
    assert not s.decide(0, "b", now=50, alive=alive.__getitem__).serve  # alive: slow, wait
    assert s.decide(0, "b", now=101, alive=alive.__getitem__).serve  # stuck: 10x reserve
    s.sent(0, "b", now=101)
    alive.update(a=False, b=False)
    assert s.decide(0, "c", now=102, alive=alive.__getitem__).serve  # all recipients died


def test_no_queue_admits_while_a_slot_is_free() -> None:
    """max_waiting=0 means "never queue", not "never serve"."""
    u = UploadSlots(slots=2, max_waiting=0)
    assert u.admit() and u.request("a", 0)
    assert u.admit() and u.request("b", 1)
    assert not u.admit()
    assert u.release("a") == []
    assert u.admit()


async def test_a_grant_whose_waiter_was_cancelled_passes_its_slot_on() -> None:
    """Regression (UCX transfer tests, node closing): a writer cancelled while it waited
    for a slot cancelled the grant's future; the release that then handed it the slot
    raised InvalidStateError instead of passing the slot to the next in line."""
    up = UploadGrants(slots=1, max_waiting=10)
    first, gone, next_ = up.request("a"), up.request("b"), up.request("c")
    gone.ready.cancel()
    up.release(first)
    assert next_.ready.done() and next_.held
    up.release(next_)
    assert up.policy.active == 0


def test_an_origin_with_spare_slots_sends_repeat_copies_unless_told_not_to() -> None:
    """Regression (simulated standalone run): strict once-only seeding left 32 trainer NICs
    idle while the first rollouts queued on each other: the 2nd-10th fetches took 2-2.8x
    their bound. Idle slots now serve repeats; a remote peer or a busy uplink still waits."""
    s = SuperSeeder(2, reserve_after=10)
    assert s.decide(0, "a", 0.0).serve
    s.sent(0, "a", 0.0)
    assert not s.decide(0, "b", 0.0).serve  # no spare: the recipient passes it on
    assert s.decide(0, "b", 0.0, spare=True).serve
    assert not s.decide(0, "c", 0.0, spare=True, remote=True, local_busy=True).serve
    strict = SuperSeeder(2, reserve_after=10, serve_spare=False)
    strict.sent(0, "a", 0.0)
    assert not strict.decide(0, "b", 0.0, spare=True).serve
    slots = UploadSlots(slots=4, max_waiting=4)
    assert slots.has_spare()
    assert slots.request("x", 1) and slots.request("y", 2) and slots.has_spare()
    assert slots.request("z", 3) and not slots.has_spare()


def test_one_upload_per_peer_makes_a_peers_requests_a_queue() -> None:
    """per_peer=1: a peer's second request waits for its first to finish even with slots
    idle (two chunks at once to one peer each arrive later: a relay forwards nothing until
    a chunk is whole), while another peer is served at once."""
    u = UploadSlots(slots=4, max_waiting=10, per_peer=1)
    assert u.request("down", 0)
    assert not u.request("down", 1) and not u.request("down", 2)
    assert u.request("other", 3)  # a slot for another peer: not behind down's queue
    assert u.active == 2 and u.waiting == 2
    assert u.release("other") == []  # nobody else may start: down still has one running
    assert u.release("down") == [("down", 1)]
    assert u.release("down") == [("down", 2)]
    assert u.release("down") == [] and u.active == 0


def test_per_peer_queues_rotate_past_peers_at_their_limit() -> None:
    u = UploadSlots(slots=2, max_waiting=10, per_peer=1)
    assert u.request("a", 0) and u.request("b", 1)
    assert not u.request("a", 2) and not u.request("c", 3)
    # b finishes: a is at its limit, so c (behind a in the rotation) gets the slot.
    assert u.release("b") == [("c", 3)]
    assert u.release("a") == [("a", 2)]
