"""bench/prediction_check.py: rounds on record pooled, each predicted again from its starts."""

from __future__ import annotations

from bench.prediction_check import collect

LATE = "docs/results/linerate/n8-256MiB-1g-late-rounds2-session20.json"


def test_each_round_is_predicted_again_and_pooled_by_case_size_and_preset() -> None:
    pools = collect([LATE], 4 << 20)
    # (written before session 23: its plain row ran the node's settings of then, the swarm)
    assert set(pools) == {("late", 256 << 20, "swarm"), ("late", 256 << 20, "relay")}
    for pool in pools.values():
        assert len(pool.measured) == 2 and len(pool.simulated) == 6  # seeds 1-3 a round
        assert pool.files == [LATE]
        assert all(1.0 < x < 3.0 for x in pool.measured + pool.simulated)


def test_a_file_can_lend_only_some_presets() -> None:
    assert set(collect([f"{LATE}:relay"], 4 << 20)) == {("late", 256 << 20, "relay")}
