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


def test_rounds_report_medians_and_keep_each_round() -> None:
    """bench/linerate.py --rounds: each figure the median over rounds (each round's ratio to
    its own copy); a round that broke counts as the slowest; every round kept."""
    from bench.linerate import _medians, _ratio

    def r(ratio: float | None, egress: float) -> dict[str, object]:
        secs = None if ratio is None else 2.0 * ratio
        return {"seconds": secs, "last_over_one_copy": ratio, "publisher_egress_models": egress,
                "duplicate_fraction": 0.0, "cpu_seconds_per_gb": 1.0, "cpu_busy_fraction": 0.5,
                "healthy_short": 0, "phases": [{"x": 1}]}  # fmt: skip

    rounds = [{"relay": r(1.2, 1.0)}, {"relay": r(1.05, 1.1)}, {"relay": r(None, 1.0)}]
    out = _medians(rounds)["relay"]  # type: ignore[arg-type]
    assert out["last_over_one_copy"] == 1.2  # median of 1.05, 1.2 and a broken round
    assert out["publisher_egress_models"] == 1.0
    assert out["last_over_one_copy_rounds"] == [1.2, 1.05, None]
    assert len(out["rounds"]) == 3 and "phases" not in out
    assert _ratio(out) == "1.200 [1.050-1.200]"
    broken = _medians([{"c": r(None, 1.0)}, {"c": r(None, 1.0)}])["c"]  # type: ignore[arg-type]
    assert broken["last_over_one_copy"] is None


def test_the_prediction_starts_each_receiver_where_it_began_and_counts_from_the_first() -> None:
    """bench/linerate.py feeds the simulator each receiver's measured start (not all at
    once) and reads its prediction as it reads the run: first start to last end."""
    import argparse

    from bench.linerate import Case, _predicted

    args = argparse.Namespace(rate=1000.0)
    size = 16 << 20
    copy = size / (1000e6 / 8)
    starts = {"r1": 0.0, "r2": 0.0, "r3": 0.0, "r4": 0.0}
    together = _predicted(args, 4, size, 4 << 20, "node", {}, None, starts)
    one_late = _predicted(args, 4, size, 4 << 20, "node", {}, None, {**starts, "r4": copy})
    for a, b in zip(
        together["simulated_over_one_copy"], one_late["simulated_over_one_copy"], strict=True
    ):
        assert a >= 1.0 and b >= 2.0  # r4 began a copy late: it ends a copy after that at best
    killed = _predicted(args, 4, size, 4 << 20, "node", {}, Case("killed", 3, copy / 2), starts)
    assert len(killed["simulated_over_one_copy"]) == 3  # seeds 1-3, r3 not counted


def test_rounds_keep_every_rounds_prediction() -> None:
    """With --rounds each round is predicted from its own starts; the merged row holds
    every round's predictions, so #18's check compares medians of like with like."""
    from bench.linerate import _medians

    def r(ratio: float, sim: list[float]) -> dict[str, object]:
        return {"seconds": ratio, "last_over_one_copy": ratio, "publisher_egress_models": 1.0,
                "duplicate_fraction": 0.0, "cpu_seconds_per_gb": 1.0, "cpu_busy_fraction": 0.5,
                "healthy_short": 0, "simulated_over_one_copy": sim}  # fmt: skip

    out = _medians([{"t": r(1.4, [1.5, 1.6])}, {"t": r(1.5, [1.3, 1.4])}])["t"]  # type: ignore[arg-type]
    assert out["simulated_over_one_copy"] == [1.5, 1.6, 1.3, 1.4]
