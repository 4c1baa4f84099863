"""bench/linerate.py --net loopback: the fan-out with every node on this host's loopback
(no namespaces, no root), the run #17's loopback CPU target is read from. Real processes:
the bench itself, its raw systems and Hub processes, as someone runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "bench/linerate.py", "--net", "loopback", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_loopback_fan_out_reports_cpu_against_the_chain_and_moves_every_model(
    tmp_path: Path,
) -> None:
    """Three receivers of 24 MiB (1 MiB chunks: a relay's size) beside the raw chain, the
    chain that keeps what it relays and gloo's broadcast (torch.distributed, four ranks:
    a binomial tree of two rounds), in the same run: every receiver gets the model
    from a publisher that sends one, every row has its CPU per GB over each chain's (each
    chain's own is 1), and nothing a NIC would measure
    (rate, line-rate phases, the simulator's prediction) is made up where there is none."""
    out = tmp_path / "lb.json"
    run = _bench(
        "--receivers", "3", "--size", "24MiB", "--chunk", "1MiB",
        "--systems", "p2p,chain,chain-landed,gloo,tensorhub", "--json", str(out),
    )  # fmt: skip
    print(run.stdout, run.stderr)
    assert run.returncode == 0
    assert "fan-out on loopback" in run.stdout and "CPU / chain" in run.stdout
    assert "chain (landed)" in run.stdout and "CPU / landed" in run.stdout
    got = json.loads(out.read_text())
    assert got["net"] == "loopback" and got["rate_mbit"] is None
    chain, hub = got["chain"], got["tensorhub"]
    assert chain["healthy_short"] == 0 and chain["cpu_over_chain"] == 1.0
    landed = got["chain (landed)"]
    assert landed["healthy_short"] == 0 and landed["cpu_over_landed_chain"] == 1.0
    assert landed["publisher_egress_models"] == 1.0
    gloo = got["gloo"]  # (each rank checks the bytes it got; one short fails the run)
    assert gloo["healthy_short"] == 0 and gloo["seconds"] > 0
    assert gloo["cpu_over_chain"] == gloo["cpu_seconds_per_gb"] / chain["cpu_seconds_per_gb"]
    assert hub["healthy_short"] == 0 and len(hub["ends"]) == 3
    # Every receiver took in a whole model, the publisher sent about one (a relay).
    into = {r: sum(b for k, b in hub["links"].items() if k.endswith(f">{r}")) for r in hub["ends"]}
    assert all(m >= 0.999 for m in into.values()), into
    assert 0.999 <= hub["publisher_egress_models"] <= 1.2
    assert hub["cpu_over_chain"] == hub["cpu_seconds_per_gb"] / chain["cpu_seconds_per_gb"]
    per_landed = hub["cpu_seconds_per_gb"] / landed["cpu_seconds_per_gb"]
    assert hub["cpu_over_landed_chain"] == per_landed
    assert hub["phases"] == [] and "simulated_over_one_copy" not in hub


def test_a_half_rate_receiver_on_loopback_is_refused_with_the_reason() -> None:
    """Loopback has no NIC to halve: the bench says so and builds nothing."""
    run = _bench("--case", "slow")
    assert run.returncode == 2
    assert "--case slow needs NICs of a rate (--net netns)" in run.stderr


def test_a_cpu_load_beside_the_run_is_reported_with_what_it_got(tmp_path: Path) -> None:
    """--cpu-load runs a busy load for the whole run (bench/cpu_load.py): the
    title says so with the cores the load got, and the JSON keeps both."""
    out = tmp_path / "load.json"
    run = _bench("--receivers", "1", "--size", "8MiB", "--systems", "p2p", "--cpu-load", "0.3",
                 "--json", str(out))  # fmt: skip
    print(run.stdout, run.stderr)
    assert run.returncode == 0
    assert "beside a CPU load of 0.3" in run.stdout  # (rich wraps the rest of the title)
    load = json.loads(out.read_text())["cpu_load"]
    assert load["cores"] == 0.3 and 0 < load["cores_used"] <= 0.3 * 1.05 + 0.05
    assert _bench("--cpu-load", "99").returncode == 2  # (more cores than the host has)
    assert _bench("--queue-ms", "0").returncode == 2
