"""A test run killed in a hang still names the test it hung in, with its seed
(``tests/progress.py``, which ``make test`` turns on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests import progress

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import time

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_hangs():
    time.sleep(600)
"""


def test_a_run_killed_in_a_hang_names_the_test_and_what_failed(tmp_path: Path) -> None:
    """A real pytest process, killed with SIGKILL once it is in the hanging test (as the
    Makefile's ``timeout`` kills a run): the file names that test as still running and
    the one that failed, and nothing that passed."""
    (tmp_path / "test_some.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its rootdir: ids as below, anywhere
    log = tmp_path / "progress.log"
    env = {**os.environ, progress.ENV: str(log)}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.progress", "-p", "no:cacheprovider"]
    proc = subprocess.Popen(
        [*cmd, "-q", str(tmp_path / "test_some.py")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120  # (however loaded the machine: it gets there)
        while "test_hangs" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, "pytest ended before it reached the hanging test"
            assert time.monotonic() < deadline, "pytest never began the hanging test"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert progress.summary(log.read_text().splitlines()) == [
        "still running when the run ended: test_some.py::test_hangs",
        "failed in call: test_some.py::test_fails",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "tests.progress", str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "test_hangs" in out and "test_fails" in out and "test_passes" not in out


def test_the_summary_gives_each_test_its_seed_and_forgets_what_ended() -> None:
    lines = [
        "seed t.py::a 11",
        "start t.py::a",
        "start t.py::b",
        "failed t.py::b setup",
        "end t.py::b",
        "seed t.py::c 7",
        "start t.py::c",
        "end t.py::a",
    ]
    assert progress.summary(lines) == [
        "still running when the run ended: t.py::c (TENSORHUB_SEED=7)",
        "failed in setup: t.py::b",
    ]
