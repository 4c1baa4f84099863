"""bench/idle.py end to end, small: three idle Hub processes measured for a second."""

from __future__ import annotations

import json
from pathlib import Path

from .procs import run_ok


def test_idle_bench_measures_every_process(tmp_path: Path) -> None:
    out = tmp_path / "idle.json"
    proc = run_ok(
        ["bench/idle.py", "--nodes", "3", "--voters", "1", "--seconds", "1", "--json", str(out)]
    )
    res = json.loads(out.read_text())
    nodes = res["nodes"]
    assert sorted(nodes) == ["n0", "n1", "n2"]
    assert [n["voter"] for n in nodes.values()] == [True, False, False]
    for n in nodes.values():
        assert n["cores"] >= 0 and n["wakeups_per_s"] > 0  # (gossip alone wakes each)
        assert abs(n["wakeups_per_gossip_tick"] - n["wakeups_per_s"] / 50.0) < 0.01
    assert res["cores_total"] == round(sum(n["cores"] for n in nodes.values()), 4)
    assert 0.9 <= res["seconds"] <= 30
    assert "idle Hub processes" in proc.stdout
