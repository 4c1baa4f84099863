"""bench/hub_p2p.py end to end, small: two processes, a Raft voter that publishes and a Hub
that fetches, each run a new version into the same tensors, and the raw socket between
them; the bench checks the fetched bytes against the published ones itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .procs import ROOT, needs_netns, run_ok


def test_hub_p2p_publishes_fetches_and_compares_with_the_raw_socket(tmp_path: Path) -> None:
    out = tmp_path / "hub_p2p.json"
    run_ok(["bench/hub_p2p.py", "--size", "8MiB", "--runs", "2", "--json", str(out)])
    res = json.loads(out.read_text())
    assert res["verified"] is True
    assert len(res["publish_seconds"]) == len(res["fetch_seconds"]) == 2
    assert res["bytes"] >= 8 << 20 and res["chunks"] >= 2
    assert 0 < res["ratio"] < res["ratio_fetch_only"]  # publishing is part of the whole


@needs_netns
def test_hub_p2p_on_nic_limited_nodes_runs_each_side_in_its_namespace(tmp_path: Path) -> None:
    """``--net netns``: the publisher and the fetcher each behind a 200 Mbit/s veth. The
    NIC is the limit there, so both paths take about a copy's time at that rate (the
    raw one no less: the fabric is really there), and the namespaces are gone after."""
    out = tmp_path / "hub_p2p.json"
    cmd = ["bench/hub_p2p.py", "--size", "8MiB", "--runs", "1", "--net", "netns"]
    with subprocess.Popen(
        [sys.executable, *cmd, "--rate", "200", "--json", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-4000:]
    res = json.loads(out.read_text())
    assert res["verified"] is True and res["net"] == "netns" and res["rate_mbit"] == 200
    one_copy = res["bytes"] * 8 / 200e6
    assert min(res["baseline_seconds"]) > 0.9 * one_copy
    assert min(res["fetch_seconds"]) > 0.9 * one_copy
    # (netns.Fabric names its namespaces by the bench's pid; other tests may hold theirs)
    tag = proc.pid % 10000
    mine = {f"thb{tag}br", f"thb{tag}n0", f"thb{tag}n1"}
    listed = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    assert not mine & {line.split()[0] for line in listed.stdout.splitlines() if line}
