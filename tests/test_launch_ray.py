"""The launcher's Ray backend: the default demo topology as actors on a local Ray cluster,
a rollout killed by chaos (ray.kill) on the way, every version verified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tensorhub.launch.topology import default, load

pytest.importorskip("ray", reason="the dev extra installs ray")
pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (make test)
ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "examples" / "topology.yaml"


def test_the_example_topology_is_the_demos() -> None:
    assert load(TOPOLOGY) == default()


@pytest.mark.timeout(600)
def test_launch_on_a_local_ray_cluster(tmp_path: Path) -> None:
    out = tmp_path / "ray.json"
    exe = Path(sys.executable).parent / "tensorhub"
    cmd = [str(exe), "launch", "--backend", "ray", str(TOPOLOGY)]
    opts = ["--no-progress", "--no-http", "--kill-rollouts", "1", "--json", str(out)]
    proc = subprocess.run(
        [*cmd, *opts], cwd=tmp_path, capture_output=True, text=True, timeout=540, check=False
    )
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0
    res = json.loads(out.read_text())
    assert res["ok"] and res["failures"]["wrong_weights"] == 0
    assert len(res["chaos"]["killed"]) == 1
    assert [v["version"] for v in res["versions"]] == [1, 2, 3]
    assert "Ray actors" in proc.stdout
