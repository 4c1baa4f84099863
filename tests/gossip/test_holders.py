from __future__ import annotations

from tensorhub.core.gossip.holders import HolderView, Holding, encode_holding, hold_key, tier


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


def test_nearest_first_then_least_loaded() -> None:
    view = HolderView()
    loc = {
        "me": "dc1/r1/h1",
        "same_rack": "dc1/r1/h9",
        "same_dc": "dc1/r7/h3",
        "far": "dc2/r1/h1",
        "busy_rack": "dc1/r1/h8",
        "partial": "dc1/r1/h7",
    }
    full = encode_holding(Holding.of(b"\1\1\1\1"))
    for n in ("same_rack", "same_dc", "far", "busy_rack"):
        view.update(n, hold_key("policy", 3), full)
    view.update("partial", hold_key("policy", 3), encode_holding(Holding.of(b"\1\0\0\0")))
    load = {"same_rack": 0, "busy_rack": 5}
    got = view.nearest("policy", 3, 2, "me", loc.get, lambda n: load.get(n, 0))
    assert got == ["same_rack", "busy_rack", "same_dc", "far"]  # partial lacks chunk 2
    assert view.nearest("policy", 3, 0, "me", loc.get)[0] == "partial" or "partial" in view.nearest(
        "policy", 3, 0, "me", loc.get
    )
    view.update("far", hold_key("policy", 3), None)
    assert "far" not in view.holders("policy", 3)
    view.forget("same_dc")
    assert set(view.holders("policy", 3)) == {"same_rack", "busy_rack", "partial"}
    assert view.versions() == [("policy", 3)]


def test_dead_or_unknown_holders_are_skipped() -> None:
    view = HolderView()
    view.update("ghost", hold_key("m", 1), encode_holding(Holding.of(b"\1")))
    view.update("junk", hold_key("m", 1), b"\xc1not msgpack")
    assert view.nearest("m", 1, 0, "me", {"me": "a/b/c"}.get) == []
