from __future__ import annotations

from tensorhub.core.gossip.holders import (
    HolderView,
    Holding,
    encode_holding,
    encode_lag,
    hold_key,
    lag_key,
    tier,
)


def test_tier_orders_host_rack_dc() -> None:
    a = "dc1/r1/h1"
    assert tier(a, "dc1/r1/h1") == 0
    assert tier(a, "dc1/r1/h2") == 1
    assert tier(a, "dc1/r2/h1") == 2
    assert tier(a, "dc2/r1/h1") == 3


def test_holding_bitmap_roundtrip() -> None:
    h = Holding.of(bytes([1, 0, 1, 1, 0, 0, 0, 0, 1]))
    assert [h.has(i) for i in range(10)] == [1, 0, 1, 1, 0, 0, 0, 0, 1, 0]
    assert not h.complete and Holding.of(b"\1\1\1").complete


def test_the_view_lists_holders_with_what_each_holds() -> None:
    """Ranking them is the planner's (tier, then load: tensorhub/core/swarm/planner.py)."""
    view = HolderView()
    full = encode_holding(Holding.of(b"\1\1\1\1"))
    for n in ("same_rack", "same_dc", "far", "busy_rack"):
        view.update(n, hold_key("policy", 3), full)
    view.update("partial", hold_key("policy", 3), encode_holding(Holding.of(b"\1\0\0\0")))
    hs = view.holders("policy", 3)
    assert {n for n, h in hs.items() if h.has(2)} == {"same_rack", "same_dc", "far", "busy_rack"}
    assert hs["partial"].has(0) and not hs["partial"].complete and hs["far"].complete
    assert view.holding("policy", 3, "partial") == hs["partial"]
    assert view.holding("policy", 3, "nobody") is None and view.holding("x", 1, "far") is None
    view.update("far", hold_key("policy", 3), None)
    assert "far" not in view.holders("policy", 3)
    assert view.holding("policy", 3, "far") is None
    view.forget("same_dc")
    assert set(view.holders("policy", 3)) == {"same_rack", "busy_rack", "partial"}
    assert view.versions() == [("policy", 3)]


def test_a_holding_that_does_not_decode_is_ignored() -> None:
    view = HolderView()
    view.update("ghost", hold_key("m", 1), encode_holding(Holding.of(b"\1")))
    view.update("junk", hold_key("m", 1), b"\xc1not msgpack")
    assert set(view.holders("m", 1)) == {"ghost"}


def test_a_holding_without_the_lagging_flag_reads_as_not_lagging_and_back() -> None:
    """Holding.lagging (a relay link that fell behind) is a trailing field: a holding
    advertised by a node that predates it reads as not lagging, and one that has it reads
    on such a node as before."""
    import msgspec

    class Before(msgspec.Struct, frozen=True, array_like=True):
        num_chunks: int
        bitmap: bytes
        origin: bool = False
        borrowed: bool = False

    old = msgspec.msgpack.encode(Before(3, b"\x05", True, True))
    assert msgspec.msgpack.decode(old, type=Holding) == Holding(3, b"\x05", True, True, False)
    new = encode_holding(Holding.of(b"\x01\x00\x01", lagging=True))
    assert msgspec.msgpack.decode(new, type=Before) == Before(3, b"\x05")
    assert msgspec.msgpack.decode(new, type=Holding).lagging


def test_a_newer_version_counts_as_fetched_once_a_non_origin_holds_it_whole() -> None:
    """What tells a fetch stalled on v1 that v1 was superseded, without asking the
    registry: a node other than the publisher holds a newer version whole (it fetched it,
    so it was committed). The publisher's own copy does not count (advertised before the
    commit), nor does a partial one, an older one, or another model's."""
    view = HolderView()
    view.update("trainer", hold_key("policy", 2), encode_holding(Holding.of(b"\1\1", origin=True)))
    view.update("half", hold_key("policy", 3), encode_holding(Holding.of(b"\1\0")))
    view.update("old", hold_key("policy", 0), encode_holding(Holding.of(b"\1\1")))
    view.update("other", hold_key("critic", 4), encode_holding(Holding.of(b"\1\1")))
    assert view.newer_fetched("policy", 1) is None
    view.update("r1", hold_key("policy", 2), encode_holding(Holding.of(b"\1\1")))
    assert view.newer_fetched("policy", 1) == 2
    assert view.newer_fetched("policy", 2) is None
    view.update("r2", hold_key("policy", 3), encode_holding(Holding.of(b"\1\1")))
    assert view.newer_fetched("policy", 1) == 3


def test_a_nodes_lag_memory_is_kept_per_model_until_cleared_or_the_node_is_forgotten() -> None:
    """The version of a node's last fetch in which its relay fell behind, under its own
    key (not in the version's holding, which an engine fetching into its own weights
    withdraws as the next fetch begins): ChunkPlanner.set_lagged_before reads it."""
    view = HolderView()
    view.update("r3", lag_key("policy"), encode_lag(7))
    view.update("r5", lag_key("policy"), encode_lag(6))
    view.update("r5", lag_key("value"), encode_lag(6))
    view.update("r3", hold_key("policy", 7), None)  # (its holding withdrawn: kept still)
    assert view.lagged("policy") == {"r3": 7, "r5": 6}
    view.update("r3", lag_key("policy"), None)  # a fetch without a lag clears it
    view.update("r5", lag_key("policy"), b"\xc1")  # undecodable: no memory
    assert view.lagged("policy") == {} and view.lagged("value") == {"r5": 6}
    view.forget("r5")  # (dead: gossip drops what it said)
    assert view.lagged("value") == {} and view.versions() == []
