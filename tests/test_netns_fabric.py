"""The NICs ``tensorhub/testing/netns.py`` gives each node: a token bucket deep enough that
the kernel never cuts an offloaded packet in software on the way through it."""

from __future__ import annotations

import json
import subprocess

import pytest

from tensorhub.testing.netns import GSO_MAX, QUEUE_MS, Fabric, tbf_burst

from .procs import needs_netns


@pytest.mark.parametrize("mbit", [100, 250, 500, 524, 750, 1000, 2000, 10000])
def test_a_nics_bucket_holds_two_offloaded_packets_and_a_millisecond_of_its_rate(
    mbit: int,
) -> None:
    """Session 42: the bucket was 1 ms of the rate, below one 64 KiB offloaded packet under
    525 Mbit/s, so tbf cut every such packet into MTU-sized ones on the sender's CPU (the
    raw chain at 500 Mbit/s: 3.0 CPU seconds per GB against 0.84 with this bucket)."""
    burst = tbf_burst(mbit, 9000)
    assert burst >= 2 * GSO_MAX
    assert burst >= mbit * 1e6 / 8 / 1000 - 1 and burst >= 4 * 9000


@needs_netns
def test_a_half_rate_nic_is_built_with_that_bucket() -> None:
    """What ``tc`` reports for a half-rate node's NIC, both ways (its end and the bridge's):
    the rate asked for, and a bucket that holds an offloaded packet and a jumbo frame."""
    with Fabric(2, 1000.0, rates={1: 500.0}) as f:
        out = subprocess.run(
            ["ip", "netns", "exec", f.ns(1), "tc", "-j", "qdisc", "show", "dev", "eth0"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        (tbf,) = [q for q in json.loads(out.stdout) if q["kind"] == "tbf"]
        assert tbf["options"]["rate"] == 500e6 / 8
        assert tbf["options"]["burst"] > GSO_MAX + f.mtu
        assert tbf["options"]["lat"] == QUEUE_MS * 1000  # (tc's microseconds)
        bridge = subprocess.run(
            ["ip", "netns", "exec", f.bridge_ns, "tc", "-j", "qdisc", "show"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        ends = [q["options"] for q in json.loads(bridge.stdout) if q["kind"] == "tbf"]
        assert sorted(o["rate"] for o in ends) == [500e6 / 8, 1000e6 / 8]
        assert all(o["burst"] > GSO_MAX + f.mtu for o in ends)


@needs_netns
def test_a_nics_queue_is_as_deep_as_asked_both_ways() -> None:
    """``queue_ms`` (bench/linerate.py --queue-ms) sets how long a packet may wait in every
    NIC's queue, at the node's end and the bridge's."""
    with Fabric(2, 1000.0, rates={1: 500.0}, queue_ms=5) as f:
        lats = []
        for ns, dev in ((f.ns(0), "eth0"), (f.ns(1), "eth0"), (f.bridge_ns, None)):
            cmd = ["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show"]
            out = subprocess.run(cmd + (["dev", dev] if dev else []), check=True,
                                 capture_output=True, text=True)  # fmt: skip
            lats += [q["options"]["lat"] for q in json.loads(out.stdout) if q["kind"] == "tbf"]
        assert lats == [5000] * 4
