"""The shipped scenarios' generation times against the published figure they are tied to.

Seer (arXiv:2511.14617) reports that in synchronous rollouts the last 10 % of responses to
finish take up to half of the rollout. The scenario files turn that into a per-response
log-normal sigma and a number of responses per instance; these tests check that the
numbers in the files do reproduce the figure, so an edit to either cannot silently drop
the calibration."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from sim.scenario import Scenario, load

SCENARIOS = Path(__file__).resolve().parents[1] / "sim" / "scenarios"
SEER_RESPONSES = 600 * 16  # Qwen2-VL-72B: 600 prompts per step, 16 responses each


def _tail_share(sigma: float, responses: int, seed: int) -> float:
    """The share of the rollout the last 10 % of responses take: every response starts at
    once, so the rollout ends with the longest and the tail starts at the 90th
    percentile."""
    rng = random.Random(seed)
    times = sorted(rng.lognormvariate(0.0, sigma) for _ in range(responses))
    return 1.0 - times[int(0.9 * responses) - 1] / times[-1]


@pytest.mark.parametrize(("sigma", "responses"), [(0.28, SEER_RESPONSES), (0.30, 4_800)])
def test_sigma_gives_seers_tail(sigma: float, responses: int) -> None:
    """Half the rollout in the last tenth, at 16 responses per prompt (and 8)."""
    shares = [_tail_share(sigma, responses, seed) for seed in range(30)]
    assert 0.47 <= statistics.median(shares) <= 0.53, shares


@pytest.mark.parametrize("name", ["standalone", "crossdc"])
def test_scenarios_spread_seers_responses_over_their_instances(name: str) -> None:
    sc = load(SCENARIOS / f"{name}.yaml")
    assert sc.gen_sigma == 0.28
    assert sc.gen_requests * sc.rollout_hosts == SEER_RESPONSES


def test_one_response_per_instance_is_the_plain_log_normal() -> None:
    """gen_requests=1 draws exactly what the per-instance model drew (old traces hold)."""
    sc = Scenario("s", "standalone", gen_median_s=30.0, gen_sigma=0.3, seed=4)
    rng = random.Random(4 * 7919 + 17)
    assert sc.generation_times(50) == [rng.lognormvariate(math.log(30.0), 0.3) for _ in range(50)]


def test_the_median_instance_keeps_gen_median_and_instances_spread_less() -> None:
    sc = Scenario("s", "standalone", gen_median_s=30.0, gen_sigma=0.28, gen_requests=100)
    times = sc.generation_times(3_000)
    assert statistics.median(times) == pytest.approx(30.0, rel=0.02)
    spread = statistics.pstdev(math.log(t) for t in times)
    assert 0.09 < spread < 0.15  # the longest of 100 spreads far less than one (0.28)


def test_gen_requests_must_be_positive() -> None:
    with pytest.raises(ValueError, match="gen_requests"):
        Scenario("s", "standalone", gen_requests=0)
