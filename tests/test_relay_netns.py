"""The relay preset on NIC-limited nodes (network namespaces, root only): Hub processes,
each behind a veth whose rate ``tc tbf`` limits, as bench/linerate.py runs them."""

from __future__ import annotations

import os
import shutil

import pytest

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces with tc need root, ip and tc",
)


@needs_netns
def test_two_slow_links_of_a_relay_chain_both_fall_back_and_every_copy_ends_verified() -> None:
    """Receivers 2 and 4 of 6 on NICs at half rate: each falls behind the link before it,
    moves to the chain's tail and relays from it, or from the other if that one fell
    behind first and is ahead of it: a laggard parks what it lacks for a laggard
    (GetChunk.lagging) where it answers any other link "busy". Before laggards chained, a
    laggard refused a laggard everything it lacked, and the second asked again at once.
    Every receiver ends with the model, each chunk verified against the manifest, the
    healthy ones well before two copies' time, and the publisher sends one model."""
    from bench.linerate import _tensorhub
    from tensorhub.testing.netns import Fabric

    size, rate, chunk = 64 << 20, 400.0, 1 << 20
    with Fabric(7, rate, rates={2: rate / 2, 4: rate / 2}) as fabric:
        out = _tensorhub(fabric, 6, size, "relay", chunk)
    one_copy = size / (rate * 1e6 / 8)
    print(
        "last receiver / one copy:",
        round(out["seconds"] / one_copy, 3),
        "links:",
        out["links"],
        "failures:",
        out["failures"],
    )
    assert out["healthy_short"] == 0
    assert out["publisher_egress_models"] < 1.5
    refused = sum(f.get("busy", 0) for f in out["failures"])
    assert refused < 200, out["failures"]  # (a livelock refuses thousands)
    # Each slow one's own bound is two copies, and a chain held to its pace takes that
    # too: the healthy ones, run around them, finish sooner.
    assert out["seconds"] < 10 * one_copy


@needs_netns
def test_a_slow_link_remembered_from_the_last_step_is_the_chains_tail_from_the_start() -> None:
    """The lag memory across real processes: r3 of 4 on a half-rate NIC falls behind in
    the first step and keeps that in gossip (``l/<key>``, HolderView.lagged) though it
    drops the version; in the second step every node begins with it at the chain's tail.
    So r4 takes nothing from r3: without the memory it relayed from r3 until r3's verdict
    (0.3 of the model). Only that is asserted of the chain: under load (the suite on both
    cores) a link that began its fetch late went to the tail too, and the healthy links
    chained otherwise than r1, r2, r4 (r4 from r1, r2 from r4)."""
    from bench.linerate import Case, _tensorhub
    from tensorhub.testing.netns import Fabric

    size, rate, chunk = 64 << 20, 400.0, 1 << 20
    with Fabric(5, rate, rates={3: rate / 2}) as fabric:
        out = _tensorhub(fabric, 4, size, "node", chunk, Case("slow", 3), steps=2)
    one_copy = size / (rate * 1e6 / 8)
    print("each step / one copy:", [round(t / one_copy, 3) for t in out["step_seconds"]])
    print("links of the second step:", out["links"], "failures:", out["failures"])
    links = out["links"]
    assert out["healthy_short"] == 0 and out["duplicate_fraction"] < 0.05
    assert links.get("r3>r4", 0.0) < 0.05  # (no chunk of the second step through r3)
