"""`make demo` keeps working: the launcher's default topology, one version, end to end."""

from __future__ import annotations

import subprocess
import sys

from .procs import ROOT


def test_demo_runs_the_default_topology_and_verifies() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tensorhub.cli",
            "demo",
            "--versions",
            "1",
            "--steps",
            "1",
            "--no-progress",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "what happened" in out.stdout and "per datacenter" in out.stdout
    assert "0 rollouts on wrong weights" in out.stdout
