"""bench/cpu_load.py: the load the benchmarks run beside a case to tell the
host's spare CPU from the protocol. Real processes: the load is a process of its own, and
what matters is that it ends however its owner does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cpu_load import CpuLoad

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    """Running (a zombie not yet reaped by whoever adopted it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ended_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_a_load_runs_while_open_reports_what_it_took_and_is_gone_after() -> None:
    """Two processes for 1.5 cores, each busy; both gone once the context closes. What
    they took is read, not assumed: under contention a load gets less than it asks."""
    with CpuLoad(1.5) as load:
        pids = load.pids
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        time.sleep(0.5)
    assert not any(_alive(p) for p in pids)
    assert load.seconds >= 0.5
    assert 0 < load.cores_used <= 1.5 * 1.05  # (never more than asked, clock ticks aside)


def test_no_load_starts_nothing() -> None:
    with CpuLoad(0) as load:
        assert load.pids == []
    assert load.cores_used == 0.0 and load.seconds == 0.0


@pytest.mark.parametrize("cores", [-0.1, (os.cpu_count() or 1) + 1])
def test_a_load_out_of_range_is_refused(cores: float) -> None:
    with pytest.raises(ValueError, match="CPU load"):
        CpuLoad(cores)


def test_a_load_ends_by_itself_once_its_time_is_up() -> None:
    with CpuLoad(0.1, max_seconds=0.3) as load:
        pids = load.pids
        assert _ended_within(pids, 10.0)


def test_a_load_ends_by_itself_when_its_owner_is_killed() -> None:
    """A benchmark killed with SIGKILL runs no cleanup: its load notices its parent is
    gone and stops, leaving no busy loop on the host."""
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from bench.cpu_load import CpuLoad\n"
            "with CpuLoad(0.2) as load:\n"
            "    print(*load.pids, flush=True)\n"
            "    time.sleep(600)\n",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as owner:
        try:
            assert owner.stdout is not None
            pids = [int(p) for p in owner.stdout.readline().split()]
            assert len(pids) == 1 and _alive(pids[0])
            owner.send_signal(signal.SIGKILL)
            owner.wait(timeout=10)
            assert _ended_within(pids, 10.0), f"load {pids} outlived its killed owner"
        finally:
            owner.kill()
