"""A bounded, duty-cycled CPU load beside a benchmark: how a result moves when the host has
fewer cores to spare.

The NIC-limited benchmarks run every node on one host, so a ratio there depends on whether
the host has the cores line rate asks for (bench/linerate.py's "cores at line rate"). To
tell a protocol's cost from the host's, the same case is run with and without a known
load beside it: if the figure follows the load, it follows the host. The load is
``cores`` of CPU: ``ceil(cores)`` processes, each busy for its share of every
``PERIOD`` and asleep the rest, so the scheduler sees many short bursts (as a busy
neighbour) rather than one process that never yields.

Every load process ends on its own once its parent is gone or after ``MAX_SECONDS``,
whichever is first: a benchmark killed with SIGKILL leaves no busy loop behind.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from types import TracebackType

from bench.common import process_cpu

PERIOD = 0.01
"""Seconds of one busy-then-asleep cycle: shorter than the benchmark's chunk times (33 ms
at 1 Gbit/s), so the load takes its share of every chunk."""
MAX_SECONDS = 3600.0
"""The longest a load process lives, whatever happens to its parent."""

_BURN = """
import os, sys, time
share, period, until = (float(a) for a in (sys.argv[1], sys.argv[2], sys.argv[4]))
parent = int(sys.argv[3])
while os.getppid() == parent and time.monotonic() < until:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < share * period:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - t0)))
"""


class CpuLoad:
    """``cores`` of busy CPU (a fraction or more) while the context is open; none for 0.

    :attr:`used` is the CPU seconds the load processes took, read as the context closes
    (of those still running then, which is all of them unless ``max_seconds`` ran out):
    the scheduler gives a load less than it asks for when every core is contended, and the
    report says what it got."""

    def __init__(self, cores: float, max_seconds: float = MAX_SECONDS) -> None:
        if not 0 <= cores <= (os.cpu_count() or 1):
            raise ValueError(f"a CPU load of {cores} cores: want 0..{os.cpu_count()}")
        self.cores = cores
        self.max_seconds = max_seconds
        self.used = 0.0
        self.seconds = 0.0
        """How long the load ran (the context was open)."""
        self._opened = 0.0
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        n = math.ceil(self.cores)
        self._opened = time.monotonic()
        until = f"{time.monotonic() + self.max_seconds:.3f}"  # (CLOCK_MONOTONIC: system-wide)
        try:
            for _ in range(n):
                args = [str(self.cores / n), str(PERIOD), str(os.getpid()), until]
                self._procs.append(subprocess.Popen([sys.executable, "-c", _BURN, *args]))
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                with contextlib.suppress(OSError, IndexError, ValueError):  # (ended meanwhile)
                    self.used += process_cpu(p.pid)
            p.kill()
        for p in self._procs:
            p.wait()
        if self._procs:
            self.seconds = time.monotonic() - self._opened
        self._procs.clear()

    @property
    def pids(self) -> list[int]:
        """The load's processes while it runs."""
        return [p.pid for p in self._procs]

    @property
    def cores_used(self) -> float:
        """The cores the load took on average while it ran (0 before it ends)."""
        return self.used / self.seconds if self.seconds > 0 else 0.0
