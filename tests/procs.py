"""Child processes for multi-process tests: start one, wait for its READY line, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tensorhub.io.tcp import free_ports
from tensorhub.testing.netns import unavailable

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["ROOT", "free_ports", "kill", "needs_netns", "run_ok", "spawn"]

_NO_NETNS = unavailable()
needs_netns = pytest.mark.skipif(_NO_NETNS is not None, reason=f"network namespaces: {_NO_NETNS}")
"""For tests that build network namespaces (tensorhub/testing/netns.py): skipped, with the
reason, without root, ``ip`` or ``tc``."""


def spawn(args: list[str], secret: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Run ``python -m tensorhub.cli ARGS`` and return it with the words of its READY line."""
    env = {**os.environ, "TENSORHUB_SECRET": secret}
    p = subprocess.Popen(
        [sys.executable, "-m", "tensorhub.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    words = p.stdout.readline().split()
    if not words or words[0] != "READY":
        kill(p)
        raise AssertionError(f"child did not start: {words}")
    return p, words


def kill(p: subprocess.Popen[str]) -> None:
    """kill -9, reap, close the pipe."""
    if p.poll() is None:
        os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    if p.stdout is not None:
        p.stdout.close()


def run_ok(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in the repository root (a benchmark, as someone runs it), its
    output captured; it must succeed, and its output's tails say why not."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc
