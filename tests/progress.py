"""Which tests a killed run was in: a pytest plugin that writes each test's start, failure
and end to a file as they happen, and a reader that names the tests begun and never ended.

Why: ``make test`` bounds the whole run (``timeout 1200``), and a run killed there loses
pytest's summary, so a hang is left without a name or a seed (CI at c65a476: one test hung,
its worker died dumping its stack, and the run ran out of time before pytest printed
anything). The file is written line by line, so it survives the kill.

``TENSORHUB_TEST_PROGRESS=FILE`` turns it on (``make test`` sets it). Under xdist the
controller writes starts, failures and ends (it hears of each from the workers); the
``seed`` fixture writes its seed from the worker that runs the test.

    python -m tests.progress FILE   # what was still running, what failed, with seeds
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ENV = "TENSORHUB_TEST_PROGRESS"


def note(kind: str, nodeid: str, extra: str = "") -> None:
    """Append one line, ``kind nodeid [extra]``, to the progress file (if one is set)."""
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:  # (one write per line: O_APPEND)
            f.write(f"{kind} {nodeid} {extra}".rstrip() + "\n")


class Progress:
    """The hooks. Not in an xdist worker: the controller writes what it hears of them."""

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        note("start", nodeid)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            note("failed", report.nodeid, report.when or "")

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        note("end", nodeid)


def pytest_configure(config: pytest.Config) -> None:
    """Write the progress file from this process, unless it is an xdist worker."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Progress(), "tensorhub-progress")


def summary(lines: list[str]) -> list[str]:
    """What a progress file says: the tests begun and not ended (a hang, or the run was
    killed in them), then those that failed, each with its seed if it drew one."""
    started: dict[str, None] = {}
    failed: dict[str, str] = {}
    seeds: dict[str, str] = {}
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        nodeid, _, extra = rest.partition(" ")
        if kind == "start":
            started[nodeid] = None
        elif kind == "end":
            started.pop(nodeid, None)
        elif kind == "failed":
            failed.setdefault(nodeid, extra)
        elif kind == "seed":
            seeds[nodeid] = extra

    def seeded(nodeid: str) -> str:
        return f" (TENSORHUB_SEED={seeds[nodeid]})" if nodeid in seeds else ""

    out = [f"still running when the run ended: {n}{seeded(n)}" for n in started]
    out += [f"failed in {when or 'a phase'}: {n}{seeded(n)}" for n, when in failed.items()]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.progress FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"{path}: no progress file (was {ENV} set?)")
        return 0
    found = summary(path.read_text(encoding="utf-8").splitlines())
    print("\n".join(found) if found else f"{path}: every test begun ended, none failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
