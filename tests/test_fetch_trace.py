"""A fetch's timeline (``TENSORHUB_TRACE``, tensorhub/dataplane/trace.py) and its reader
(bench/trace_report.py): off unless asked for, one line per event for every fetcher of
a real relay chain over TCP, readable back into who sent what; a trace that cannot be
written stops, and the fetch does not."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tensorhub.core.naming import shard_key
from tensorhub.dataplane.trace import TRACE_ENV, FetchTrace
from tensorhub.io.tensors import empty_like_manifest

from .models import same_bytes
from .procs import needs_netns, run_ok
from .test_hub import cluster


def test_no_trace_unless_the_environment_names_a_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    assert FetchTrace.open("r1", shard_key("m", 0), 1) is None
    monkeypatch.setenv(TRACE_ENV, "")
    assert FetchTrace.open("r1", shard_key("m", 0), 1) is None


def test_a_trace_on_a_full_disk_stops_once_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """/dev/full: every write fails with ENOSPC. The events are dropped, one warning is
    logged, and nothing is raised to the fetch."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    out = open("/dev/full", "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed by it)
    trace = FetchTrace(out, "r1", shard_key("m", 0), 1)
    with caplog.at_level(logging.WARNING, logger="tensorhub.dataplane.trace"):
        trace.event("got", chunk=0, src="a:1", s=0.1)
        trace.event("got", chunk=1, src="a:1", s=0.1)
    assert out.closed
    assert [r.getMessage() for r in caplog.records if "trace stopped" in r.getMessage()] != []
    assert len([r for r in caplog.records if "trace stopped" in r.getMessage()]) == 1


async def test_every_fetcher_of_a_relay_chain_traces_its_chunks_and_the_report_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(where))
    async with cluster(tmp_path, rollouts=3, dcs=1, dataplane="relay", rack="rack0") as (
        voters,
        rolls,
    ):
        g = torch.Generator().manual_seed(3)
        w = {"w": torch.randn(2 << 20, generator=g), "b": torch.randn(100, generator=g)}
        pub = await voters[0].publish("policy", 1, w, chunk_size=1 << 20)
        intos = [empty_like_manifest(pub.manifest) for _ in rolls]
        await asyncio.gather(
            *(r.fetch("policy", 1, into) for r, into in zip(rolls, intos, strict=True))
        )
        for into in intos:
            assert all(same_bytes(w[k], into[k]) for k in w)
        chunks = pub.manifest.num_chunks
        names = {r.node.name for r in rolls}

    files = sorted(where.glob("*.jsonl"))
    events = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert {e["node"] for e in events} == names  # (the publisher fetched nothing)
    for name in names:
        mine = [e for e in events if e["node"] == name]
        kinds = [e["ev"] for e in mine]
        assert kinds[0] == "begin" and kinds[-1] == "end" and mine[-1]["error"] is None
        got = {e["chunk"] for e in mine if e["ev"] == "got"}
        assert got == set(range(chunks))  # every chunk, each from a named source
        assert all(e["version"] == 1 and e["t"] > 0 for e in mine)

    (run,) = await asyncio.to_thread(_report, where, tmp_path / "report.json")
    assert set(run["nodes"]) == names
    for name, n in run["nodes"].items():
        assert sum(n["chunks_from"].values()) == n["chunks"] == chunks, (name, n)
        assert n["error"] is None and n["end_s"] >= n["begin_s"] >= 0
    # The chain's sources are named by node where they traced too: a later link names an
    # earlier one (relaying), not only addresses.
    assert any(src in names for n in run["nodes"].values() for src in n["chunks_from"])


async def test_a_fetch_loop_held_off_its_ticks_traces_the_stall_and_tells_its_planner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop held for 0.15 s just after a fetch's first chunk (a callback that
    does not yield, as in a process starved of CPU): the fetch loop's next tick finds it
    missed 15, more than STALL_TICKS; it tells its planner (ChunkPlanner.stalled, whose
    lag look then discounts what the gap grew meanwhile), traces a ``stalled`` event with
    the ticks missed, and the fetch ends with every byte. bench/trace_report.py lists it
    under the node's stalls."""
    import time

    from bench.trace_report import load
    from tensorhub.core.swarm.planner import ChunkPlanner
    from tensorhub.dataplane import swarm

    where = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(where))
    told: list[int] = []
    tell = ChunkPlanner.stalled

    def stalled(self: ChunkPlanner) -> None:
        told.append(self.now)
        tell(self)

    monkeypatch.setattr(ChunkPlanner, "stalled", stalled)
    complete = swarm._Driver.completed
    held: list[int] = []

    async def completed(self: swarm._Driver, task: asyncio.Task[None]) -> int | None:
        chunk = await complete(self, task)
        if chunk is not None and not held:
            held.append(chunk)
            time.sleep(0.15)  # noqa: ASYNC251 (the point: the loop held, no tick runs)
        return chunk

    monkeypatch.setattr(swarm._Driver, "completed", completed)
    async with cluster(tmp_path, rollouts=1, dcs=1, rack="rack0") as (voters, (roll,)):
        g = torch.Generator().manual_seed(5)
        w = {"w": torch.randn(8 << 20, generator=g)}  # 32 MiB: 32 chunks, not all at once
        pub = await voters[0].publish("policy", 1, w, chunk_size=1 << 20)
        into = empty_like_manifest(pub.manifest)
        await roll.fetch("policy", 1, into)
        assert same_bytes(w["w"], into["w"])
        name = roll.node.name
    assert held and told, (held, told)
    events = [
        json.loads(line) for f in where.glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    stalls = [e for e in events if e["node"] == name and e["ev"] == "stalled"]
    assert stalls and stalls[0]["ticks"] >= 14, stalls  # (0.15 s of 10 ms ticks, less rounding)
    assert [e["ev"] for e in events if e["node"] == name][-1] == "end"
    node = (await asyncio.to_thread(load, where))[name]
    assert node.stalls[0][1] == stalls[0]["ticks"]


def test_the_simulator_writes_the_same_timeline_and_the_same_verdict_each_run(
    tmp_path: Path,
) -> None:
    """sim/fanout.py's mirror of bench/linerate.py --case slow (N=4, r3 at half rate):
    the events a node writes, read by the same reader; r3 judges itself lagging, every
    receiver gets every chunk, and the run is the same twice (time is simulated)."""
    from bench.trace_report import load
    from sim.fanout import predict_each
    from tensorhub.core.swarm.presets import preset

    size, chunk = 64 << 20, 1 << 20
    for run in ("a", "b"):
        predict_each(4, size, 1000, chunk, preset("node"), 1, {3: 500}, trace=tmp_path / run)
    a, b = ((tmp_path / r / "simulated.jsonl").read_text() for r in ("a", "b"))
    assert a == b
    nodes = load(tmp_path / "a")
    assert set(nodes) == {"r1", "r2", "r3", "r4"}
    assert all({c for _, c, _ in n.got} == set(range(size // chunk)) for n in nodes.values())
    assert [n.node for n in nodes.values() if n.verdicts] == ["r3"]
    assert {src for _, _, src in nodes["r1"].got} <= {"publisher"}
    assert nodes["r4"].upstreams[0][1] == "r3" and nodes["r4"].upstreams[-1][1] == "r2"


def test_the_report_reads_a_trace_cut_short_by_a_killed_process(tmp_path: Path) -> None:
    """A node killed mid-fetch (bench/linerate.py --case killed) leaves its last line cut:
    the reader keeps what came before it; a bad line elsewhere is an error."""
    from bench.trace_report import load

    good = [
        {"t": 1.0, "node": "r3", "model": "m", "version": 1, "ev": "begin", "chunks": 4,
         "held": 0, "addr": "a:3"},
        {"t": 1.5, "node": "r3", "model": "m", "version": 1, "ev": "got", "chunk": 0,
         "src": "a:2", "s": 0.1},
    ]  # fmt: skip
    text = "".join(json.dumps(e) + "\n" for e in good)
    (tmp_path / "r3-1.jsonl").write_text(text + '{"t": 2.0, "node": "r3", "ev": "go')
    nodes = load(tmp_path)
    assert nodes["r3"].got == [(1.5, 0, "a:2")] and nodes["r3"].end is None
    (tmp_path / "r3-1.jsonl").write_text("not json\n" + text)
    with pytest.raises(SystemExit, match="not a trace line"):
        load(tmp_path)


def test_the_report_reads_each_step_of_a_multi_step_run_apart(tmp_path: Path) -> None:
    """bench/linerate.py --steps 2 --trace: each node's trace holds both of its fetches.
    Read as one, a node's begin and end were the second step's and its chunks both steps'
    (twice the model); the report gives each version its own tables, with the lag memory
    each node began on and the stalls of its fetch loop."""
    from bench.trace_report import report, versions

    def fetch(node: str, addr: str, version: int, src: str) -> list[dict[str, Any]]:
        t = 10.0 * version
        base = {"node": node, "model": "m", "version": version}
        return [
            {**base, "t": t, "ev": "begin", "chunks": 2, "held": 0, "addr": addr},
            {**base, "t": t, "ev": "lagged_before", "names": ["a:1"] if version == 2 else []},
            {**base, "t": t + 0.5, "ev": "got", "chunk": 0, "src": src, "s": 0.1},
            {**base, "t": t + 0.6, "ev": "stalled", "ticks": 7, "held": 1},
            {**base, "t": t + 1.0, "ev": "got", "chunk": 1, "src": src, "s": 0.1},
            {**base, "t": t + 1.0, "ev": "end", "held": 2, "error": None},
        ]

    for node, addr, src in (("r1", "a:1", "a:0"), ("r2", "a:2", "a:1")):
        events = fetch(node, addr, 1, src) + fetch(node, addr, 2, src)
        (tmp_path / f"{node}-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert versions(tmp_path) == [1, 2]
    steps = report(tmp_path)
    assert [r["version"] for r in steps] == [1, 2]
    for r in steps:
        r2 = r["nodes"]["r2"]
        assert r2["chunks_from"] == {"r1": 2} and r2["end_s"] == pytest.approx(1.0)
        assert r2["lagged_before"] == ([] if r["version"] == 1 else ["r1"])
        assert r2["stalls"] == [{"t_s": pytest.approx(0.6), "ticks": 7}]


def test_the_report_shows_a_link_falling_behind_its_upstream_chunk_by_chunk(
    tmp_path: Path,
) -> None:
    """N=8 at 1 GiB (session 42): the second link ended 0.5-0.6 s after the first, 2 ms
    later with each chunk, while every later link kept pace. The trail table says so:
    r2 takes each of 64 chunks 2 ms later than the last behind r1 and asks for them only
    once r1 holds them; r3 asks ahead (cut through) and trails r2 by a flat 5 ms."""
    from bench.trace_report import TRAIL_SPAN, report

    n = 4 * TRAIL_SPAN

    def fetch(node: str, addr: str, src: str, at: Any, ask: Any) -> list[dict[str, Any]]:
        base = {"node": node, "model": "m", "version": 1}
        out = [{**base, "t": 0.0, "ev": "begin", "chunks": n, "held": 0, "addr": addr}]
        for c in range(n):
            out.append({**base, "t": ask(c), "ev": "ask", "chunk": c, "src": src, "dup": False})
            out.append({**base, "t": at(c), "ev": "got", "chunk": c, "src": src, "s": 0.03})
        return out

    def r1(c: int) -> float:
        return 0.034 * (c + 1)

    def r2(c: int) -> float:
        return r1(c) + 0.010 + 0.002 * c

    traces = {
        "r1": fetch("r1", "a:1", "a:0", r1, lambda c: 0.0),
        "r2": fetch("r2", "a:2", "a:1", r2, lambda c: r1(c) + 0.001),
        "r3": fetch("r3", "a:3", "a:2", lambda c: r2(c) + 0.005, lambda c: r2(c) - 0.05),
    }
    for node, events in traces.items():
        (tmp_path / f"{node}-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run,) = report(tmp_path)
    links = {(k["up"], k["node"]): k for k in run["trails"]}
    assert set(links) == {("r1", "r2"), ("r2", "r3")}  # (r1's source traced nothing)
    slow, flat = links["r1", "r2"], links["r2", "r3"]
    assert slow["chunks"] == n and slow["asked_ahead"] == 0.0
    assert slow["growth_ms_per_chunk"] == pytest.approx(2.0)
    assert slow["last_ms"] - slow["first_ms"] == pytest.approx(2.0 * (n - TRAIL_SPAN))
    assert flat["asked_ahead"] == 1.0 and flat["growth_ms_per_chunk"] == pytest.approx(0.0)
    assert flat["first_ms"] == pytest.approx(5.0) == flat["last_ms"]


@needs_netns
def test_linerate_traces_each_round_beside_the_simulators_and_the_report_reads_both(
    tmp_path: Path,
) -> None:
    """``bench/linerate.py --trace DIR``: the Hub processes of a round write their
    timelines into ``round1-node`` (every receiver, every chunk), and the simulator's of
    the same round goes beside it (``round1-node-simulated``); the report reads both.
    Each row says how many cores its CPU per GB would keep busy at line rate (every
    receiver's NIC full: two at 400 Mbit/s, p2p's one)."""
    where, out = tmp_path / "trace", tmp_path / "lr.json"
    cmd = ["bench/linerate.py", "--receivers", "2", "--size", "16MiB", "--rate", "400"]
    run_ok(
        [*cmd, "--systems", "p2p,tensorhub", "--trace", str(where), "--json", str(out)],
        timeout=300,
    )
    got = json.loads(out.read_text())
    for system, receivers in (("p2p", 1), ("tensorhub", 2)):
        r = got[system]
        want = r["cpu_seconds_per_gb"] * receivers * 0.05  # (400 Mbit/s: 0.05 GB/s)
        assert r["cpu_cores_at_line_rate"] == pytest.approx(want), system
    assert sorted(d.name for d in where.iterdir()) == ["round1-node", "round1-node-simulated"]
    runs = {r["run"]: r for r in _report(where, tmp_path / "report.json")}
    for run in runs.values():
        assert set(run["nodes"]) == {"r1", "r2"}
        for n in run["nodes"].values():
            assert n["chunks"] >= 4 and sum(n["chunks_from"].values()) == n["chunks"], run


def _report(where: Path, out: Path) -> list[dict[str, Any]]:
    """bench/trace_report.py on ``where``: the runs its JSON describes."""
    run_ok(["bench/trace_report.py", str(where), "--json", str(out)], timeout=120)
    runs: list[dict[str, Any]] = json.loads(out.read_text())["runs"]
    return runs
