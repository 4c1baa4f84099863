"""The launcher: topologies are validated, and a run with chaos ends verified (issue #7)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from tensorhub.launch import TopologyError, default, from_dict, launch
from tensorhub.launch.topology import parse_bandwidth

SMALL = {
    "model": {"dim": 64, "layers": 2, "vocab": 512, "heads": 2, "context": 16},
    "run": {"versions": 3, "train_steps": 1, "chunk_mb": 0.25, "timeout_s": 240},
    "nodes": [
        {"name": "trainer", "at": "dc1/rack1", "role": "trainer"},
        {"name": "a1", "at": "dc1/rack1", "voter": True},
        {"name": "a2", "at": "dc1/rack2", "voter": True},
        {"name": "a3", "at": "dc1/rack2"},
        {"name": "b1", "at": "dc2/rack1", "voter": True},
        {"name": "b2", "at": "dc2/rack1"},
        {"name": "b3", "at": "dc2/rack2"},
    ],
    "wan": [{"between": ["dc1", "dc2"], "bandwidth": "1Gbit", "rtt_ms": 5}],
    "chaos": {"kill_rollouts": 1, "kill_leader": True, "seed": 3},
    "http": True,
}


def test_default_topology_is_two_dcs_of_two_racks_with_six_rollouts() -> None:
    t = default()
    assert t.datacenters == ["dc1", "dc2"] and len(t.rollouts) == 6 and len(t.voters) == 3
    assert {n.at for n in t.nodes} == {"dc1/rack1", "dc1/rack2", "dc2/rack1", "dc2/rack2"}
    assert t.links_from("dc2") == {"dc1": (2e9 / 8, 0.01)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nodez": []}, "nodez: unknown key"),
        ({"nodes": [{"name": "t", "at": "dc1", "role": "trainer"}]}, "must be dc/rack"),
        ({"nodes": SMALL["nodes"][1:]}, "exactly one node must have role: trainer"),
        ({"wan": [{"between": ["dc1", "mars"]}]}, "no node is in datacenter 'mars'"),
        ({"wan": [{"between": ["dc1", "dc2"], "bandwidth": "fast"}]}, "cannot parse bandwidth"),
        ({"chaos": {"kill_rollouts": 6}}, "leave at least one rollout alive"),
        ({"chaos": {"kil_leader": True}}, r"chaos.kil_leader: unknown key"),
        ({"nodes": SMALL["nodes"][:3], "wan": []}, "1, 3 or 5 voters"),
        ({"run": {"dataplane": "fast"}}, "run.dataplane: no data-plane preset 'fast'"),
        ({"run": {"step_s": -1}}, r"run.step_s"),
    ],
)
def test_bad_topologies_are_refused_naming_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        from_dict({**SMALL, **change})


def test_bandwidth_units() -> None:
    assert parse_bandwidth("2Gbit", "x") == 2e9 / 8
    assert parse_bandwidth("100MB/s", "x") == 100e6
    assert parse_bandwidth("1.5gbit/s", "x") == 1.5e9 / 8
    assert parse_bandwidth(1000, "x") == 1000.0


@pytest.mark.timeout(400)
def test_three_versions_with_chaos_kills_end_verified(tmp_path: Path) -> None:
    """A rollout and the Raft leader are killed with SIGKILL mid-run; the run goes on, the
    JSON counts the kills, and no rollout ever holds weights other than the trainer's."""
    out = tmp_path / "results.json"
    res = launch(
        from_dict(SMALL), json_path=out, progress=False, console=Console(width=120, quiet=True)
    )
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(res))
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the timeline
    assert data["ok"] and data["failures"]["wrong_weights"] == 0
    assert data["chaos"]["crashed"] == [], data["chaos"]
    # A rollout that falls a version behind (a slow WAN under load) may find that version
    # gone: its holders fetched the next one into the same memory and let it go (the
    # mutability contract). That fetch fails cleanly, and the rollout catches up.
    last = len(data["versions"])
    for f in data["fetch_failures"]:
        assert f["version"] < last and "no usable holder" in f["error"], f
    final = {x["who"] for x in data["versions"][-1]["fetches"] if x["verified"]}
    killed_names = {k["who"] for k in data["chaos"]["killed"]}
    rollouts = {n["name"] for n in SMALL["nodes"] if n.get("role") != "trainer"}  # type: ignore[attr-defined]
    assert final == rollouts - killed_names, (final, data["fetch_failures"])
    killed = data["chaos"]["killed"]
    assert len(killed) == 2 and data["failures"]["killed"] == 2
    assert any("Raft leader" in k["why"] for k in killed)
    assert all(k["who"] != "trainer" for k in killed)
    assert [v["version"] for v in data["versions"]] == [1, 2, 3]
    dead = {k["who"] for k in killed}
    survivors = {n["name"] for n in data["topology"]["nodes"]} - dead - {"trainer"}
    final = data["versions"][-1]
    assert survivors <= {f["who"] for f in final["fetches"]}  # every survivor got v3
    assert all(f["verified"] for v in data["versions"] for f in v["fetches"])
    assert all(v["trainer_stall_s"] > 0 for v in data["versions"])
    # Each version crossed the WAN into dc2 about once (counted by the fetches that
    # received it; a killed sender could not report its own last uploads).
    assert 0.5 < data["wan_bytes_in_per_version_in_models"]["dc2"] < 2.5
    assert data["bytes_uploaded_by_dc_link"].get("dc1>dc2", 0) > 0
    dc_of = {n["name"]: n["at"].split("/")[0] for n in data["topology"]["nodes"]}
    for v in data["versions"]:  # bytes per link, per version: each crossed into dc2...
        # ...where dc2 got it at all: with the leader (a dc2 voter) and a rollout killed,
        # dc2's one survivor may fall a version behind and skip it (the failure above).
        if any(f["verified"] and dc_of[f["who"]] == "dc2" for f in v["fetches"]):
            assert v["bytes_received_by_dc_link"].get("dc1>dc2", 0) > 0, v


@pytest.mark.timeout(400)
def test_deltas_cross_the_wan_instead_of_versions(tmp_path: Path) -> None:
    """Issue #21, end to end in processes: with ``run.deltas`` at an RL learning rate, v1
    crosses the WAN whole, every later version as a delta from the one before (a few
    percent of the model, once into dc2), and every rollout holds the trainer's bytes.
    Deltas and the learning rate are turned on from the command line (the YAML has
    neither), as a user would: ``tensorhub launch FILE --deltas --lr 1e-6``."""
    topo = {
        **SMALL,
        "model": {"dim": 128, "layers": 2, "vocab": 1024, "heads": 2, "context": 16},
        # The trainer waits for every rollout before it trains on, so none falls a version
        # behind (one that does fetches whole: its base is not the delta's).
        "run": {**SMALL["run"], "copies_before_reuse": 6},  # type: ignore[dict-item]
        "chaos": {},
        "http": False,
    }
    path, out = tmp_path / "topology.yaml", tmp_path / "results.json"
    path.write_text(yaml.safe_dump(topo))
    exe = Path(sys.executable).parent / "tensorhub"
    cmd = [str(exe), "launch", str(path), "--deltas", "--lr", "1e-6", "--no-progress"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=380, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] and data["failures"]["wrong_weights"] == 0
    assert not data["fetch_failures"], data["fetch_failures"]
    first, *later = data["versions"]
    assert all(f["delta_base"] is None for f in first["fetches"])
    assert first["wan_in_models_by_dc"]["dc2"] >= 0.99  # whole, about once
    for v in later:
        print(f"v{v['version']}: WAN into dc2 {v['wan_in_models_by_dc']['dc2']:.3f} models")
        assert all(f["delta_base"] == v["version"] - 1 for f in v["fetches"]), v["fetches"]
        assert all(f["verified"] for f in v["fetches"])
        assert 0 < v["wan_in_models_by_dc"]["dc2"] <= 0.1


@pytest.mark.timeout(400)
@pytest.mark.parametrize("dataplane", ["relay", "swarm"])
def test_the_relay_preset_across_racks_and_datacenters_ends_verified(
    tmp_path: Path, dataplane: str
) -> None:
    """The relay preset (a chain cutting through, the swarm as its repair; the node's
    default since session 23, named on the command line here as a user would, and the
    swarm, the default before it, beside it) had been run
    only in one rack (bench/linerate.py). Here every node of two datacenters of two racks
    runs it, chosen on the command line as a user would (``--dataplane relay``), with a
    rollout killed mid-run: every version reaches every survivor, verified, and crosses
    the WAN into dc2 about once. The first run found two faults: dc2's chain head waited
    for WAN owners that relay and never cross (v1 and v2 reached no rollout of dc2), and
    the killed link's downstream asked it again 8,258 times (``ChunkPlanner``)."""
    # Versions 3 s apart, as an RL step would be at least: with TinyLM's millisecond steps
    # the run's 3 versions came within 0.6 s, and dc2's fetches of v1, which the kill
    # delayed, stalled on until v2 was gone too (swarm: dc2 reached only v3 in 2 runs of 8
    # under two busy loops; such a stall now ends MOVED_ON_STALL after a newer version is
    # known, tests/test_swarm.py).
    run = {**SMALL["run"], "step_s": 3.0}  # type: ignore[dict-item]
    topo = {**SMALL, "run": run, "chaos": {"kill_rollouts": 1, "seed": 3}, "http": False}
    path, out = tmp_path / "topology.yaml", tmp_path / "results.json"
    path.write_text(yaml.safe_dump(topo))
    exe = Path(sys.executable).parent / "tensorhub"
    cmd = [str(exe), "launch", str(path), "--dataplane", dataplane, "--no-progress"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=380, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"data plane {dataplane}" in proc.stdout
    data = json.loads(out.read_text())
    why = (  # what a failure below needs to be read
        data["failures"],
        data["fetch_failures"],
        [(v["version"], sorted(f["who"] for f in v["fetches"])) for v in data["versions"]],
    )
    # (printed whole: pytest cuts an assertion's message, and one failure in a full run
    # on a clean clone, dc2 short of v1 and v2, left its fetch errors cut to "TransferE...")
    print("why:", json.dumps(why, indent=1, default=str), "\nstderr:", proc.stderr[-4000:])
    assert data["ok"] and data["dataplane"] == dataplane, why
    published = [v["published_at_s"] for v in data["versions"]]
    assert all(b - a >= 3.0 for a, b in itertools.pairwise(published)), published  # step_s
    assert data["failures"]["wrong_weights"] == 0 and data["chaos"]["crashed"] == [], why
    assert all(f["verified"] for v in data["versions"] for f in v["fetches"]), why
    killed = {k["who"] for k in data["chaos"]["killed"]}
    rollouts = {n["name"] for n in SMALL["nodes"] if n.get("role") != "trainer"}  # type: ignore[attr-defined]
    final = {f["who"] for f in data["versions"][-1]["fetches"] if f["verified"]}
    assert final == rollouts - killed, why
    assert 0.5 < data["wan_bytes_in_per_version_in_models"]["dc2"] < 2.5, why
    # Before the fix only v3 reached dc2. On a loaded host a rollout may still miss one
    # version (its holders moved on: NoHolder after MOVED_ON_PATIENCE), as with the node
    # preset; a chain stalled at its head takes its datacenter's rollouts with it.
    reached = [any(f["dc"] == "dc2" for f in v["fetches"]) for v in data["versions"]]
    assert sum(reached) >= len(reached) - 1, why
    assert data["failures"]["failed_requests_retried"] < 2000, why  # (8,258 before the fix)
