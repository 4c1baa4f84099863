"""`make demo` keeps working: the cluster demo runs one version end to end."""

from __future__ import annotations

import subprocess
import sys

from .procs import ROOT


def test_cluster_demo_runs_and_verifies() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tensorhub.cli", "demo", "--versions", "1", "--steps", "1"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "what happened" in out.stdout
    assert "NO" not in out.stdout.split("what happened")[1].split("The trainer")[0]
    assert "model sizes per version" in out.stdout
