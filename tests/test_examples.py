"""The examples run: a trainer and a rollout, as the README tells a new user to start them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .procs import free_ports

pytest.importorskip("transformers", reason="the dev extra installs transformers")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python examples/ARGS...`` from the examples folder, as the README does."""
    return subprocess.run(
        [sys.executable, *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["stream", "atomic"])
def test_hf_trainer_and_rollout(mode: str) -> None:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    trainer = subprocess.Popen(
        [sys.executable, "hf_trainer.py", "--listen", addr, "--steps", "2", "--linger", "60"],
        cwd=EXAMPLES,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        atomic = ["--atomic"] if mode == "atomic" else []
        rollout = _example("hf_rollout.py", "--seed", addr, "--versions", "2", *atomic)
        print(rollout.stdout, rollout.stderr[-2000:])
        assert rollout.returncode == 0
        assert "v2 loaded" in rollout.stdout
    finally:
        trainer.terminate()
        out, _ = trainer.communicate(timeout=30)
        print(out)
    assert "published v2" in out


@pytest.mark.timeout(300)
@pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (make test)
def test_ray_example() -> None:
    """Voters, a trainer and rollouts as Ray actors (engines/ray_actors.py), as
    examples/ray_rl.py runs them on a local Ray cluster."""
    pytest.importorskip("ray", reason="the dev extra installs ray")
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("tensorhub-voter-*"))
    proc = _example("ray_rl.py", "--rollouts", "2", "--steps", "2")
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0
    assert proc.stdout.count(": ok,") == 4 and "WRONG" not in proc.stdout
    assert proc.stdout.count(" at dc1/node-") == 4  # the datacenter from the node's resource
    # the voters stopped cleanly (stop_voters): each removed its Raft log (killed by
    # ray.shutdown, three were left in the temp dir on every run)
    assert set(tmp.glob("tensorhub-voter-*")) - before == set()
