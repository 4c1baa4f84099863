"""bench/linerate.py's ``gloo`` system on NIC-limited nodes (network namespaces, root only):
torch.distributed's broadcast over gloo, each rank a process in its own namespace, the
baseline #17 names beside the raw chain."""

from __future__ import annotations

from .procs import needs_netns


@needs_netns
def test_gloo_broadcasts_across_namespaces_and_breaks_below_a_killed_rank() -> None:
    """Four receivers (five ranks: gloo's tree of three rounds). Healthy, every receiver
    holds the model, checked in its own process, and the publisher's NIC sent one copy per
    round, as the bench reports from gloo's algorithm (the root posts all its sends).
    With receiver 1 killed mid-broadcast, receiver 3, which gloo's tree feeds from
    receiver 1 alone, never gets it: it gives up at gloo's timeout and counts as short,
    where tensorhub's killed-link tests end with every survivor whole (test_cut_through,
    test_relay_netns). Its sockets run under the namespaces' own congestion control."""
    from bench.linerate import Case, _gloo
    from tensorhub.testing.netns import Fabric

    size, rate = 16 << 20, 400.0
    one = size / (rate * 1e6 / 8)
    with Fabric(5, rate) as fabric:
        before = fabric.counters()[0][0]
        healthy = _gloo(fabric, [1, 2, 3, 4], size, one)
        sent = (fabric.counters()[0][0] - before) / size  # (frames' headers included)
        killed = _gloo(fabric, [1, 2, 3, 4], size, one, Case("killed", 1, one / 4))
        default = fabric.congestion_control()
    print("healthy:", healthy, "killed:", killed, "publisher's NIC sent", sent)
    assert healthy["healthy_short"] == 0 and healthy["seconds"] > 0
    assert healthy["publisher_egress_models"] == 3.0
    assert 3.0 <= sent < 3.1, sent
    assert healthy["congestion_control"] == default
    assert killed["healthy_short"] == 1 and killed["seconds"] is None
