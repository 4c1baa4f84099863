"""bench/hub_p2p.py end to end, small: two processes, a Raft voter that publishes and a Hub
that fetches, each run a new version into the same tensors, and the raw socket between
them; the bench checks the fetched bytes against the published ones itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hub_p2p_publishes_fetches_and_compares_with_the_raw_socket(tmp_path: Path) -> None:
    out = tmp_path / "hub_p2p.json"
    proc = subprocess.run(
        [sys.executable, "bench/hub_p2p.py", "--size", "8MiB", "--runs", "2", "--json", str(out)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["verified"] is True
    assert len(res["publish_seconds"]) == len(res["fetch_seconds"]) == 2
    assert res["bytes"] >= 8 << 20 and res["chunks"] >= 2
    assert 0 < res["ratio"] < res["ratio_fetch_only"]  # publishing is part of the whole
