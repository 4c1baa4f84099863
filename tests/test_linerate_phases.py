"""bench/linerate.py's profile of a transfer from NIC counters (no namespaces needed)."""

from __future__ import annotations

from bench.linerate import _phases


def test_phases_count_line_rate_use_and_skip_finished_receivers() -> None:
    """Two receivers on 8 Mbit/s (1e6 B/s) NICs: one done after 1 s, the other after 2 s.
    The second half's least ingress is the one still fetching, not the finished one."""
    samples = [
        (0.0, [(0, 0), (0, 0), (0, 0)]),  # (sent, received) of publisher, r1, r2
        (1.0, [(2_000_000, 0), (0, 1_000_000), (0, 1_000_000)]),
        (2.0, [(2_000_000, 0), (0, 1_000_000), (0, 2_000_000)]),
    ]
    first, second = _phases(samples, 8.0, parts=2)
    assert first == {"publisher_egress": 2.0, "ingress_mean": 1.0, "ingress_min": 1.0}
    assert second == {"publisher_egress": 0.0, "ingress_mean": 0.5, "ingress_min": 1.0}
