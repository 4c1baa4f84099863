"""Read the fetch timelines ``TENSORHUB_TRACE`` wrote (``bench/linerate.py --trace DIR``):
where each link's chunks came from and when, and where every link stood when one of them
judged itself lagging.

The questions of issue #17's slow cases, each answered from the trace instead of from a
throwaway log patch: when did the slow link judge itself (how many chunks in), how far
behind the link before it was the link after it then, and whom did each link take its
chunks from. Times are seconds after the first fetch of the run began.

    python bench/linerate.py --receivers 4 --case slow --rounds 1 --systems p2p,tensorhub \\
        --cc cubic --trace out/trace
    python bench/trace_report.py out/trace
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, write_json


@dataclass
class NodeTimeline:
    """One node's fetch, from its events."""

    node: str
    addr: str = ""
    begin: float | None = None
    end: float | None = None
    error: str | None = None
    held0: int = 0
    chunks: int = 0  # in the version
    got: list[tuple[float, int, str]] = field(default_factory=list)  # (t, chunk, source)
    upstreams: list[tuple[float, str | None, int]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)
    lagged_before: list[str] = field(default_factory=list)  # the lag memory read at the start
    stalls: list[tuple[float, int]] = field(default_factory=list)  # (t, ticks the loop missed)
    asked: dict[int, float] = field(default_factory=dict)  # chunk: when it was first asked for

    def held_at(self, t: float) -> int:
        """Chunks this node held at time ``t``."""
        return self.held0 + sum(1 for when, _, _ in self.got if when <= t)


def _events(run: Path) -> Iterator[dict[str, Any]]:
    """Every event of the traces in ``run``, file by file."""
    for path in sorted(run.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                if i == len(lines) - 1:  # (a process killed mid-write: its last line is cut)
                    break
                raise SystemExit(f"{path}:{i + 1}: not a trace line ({err})") from None


def versions(run: Path) -> list[int]:
    """The versions fetched in ``run``, oldest first: one, or a run of RL steps
    (bench/linerate.py --steps), whose fetches each node's trace holds one after another."""
    return _versions(_events(run))


def _versions(events: Iterable[dict[str, Any]]) -> list[int]:
    return sorted({int(e["version"]) for e in events if "version" in e})


def load(run: Path, version: int | None = None) -> dict[str, NodeTimeline]:
    """Every node's timeline in ``run`` (one fetch per node: the run's version, or
    ``version``'s where a node's trace holds several: a run of RL steps)."""
    return _timelines(_events(run), version)


def _timelines(events: Iterable[dict[str, Any]], version: int | None) -> dict[str, NodeTimeline]:
    """Each node's timeline from ``events`` (``version``'s alone, if given)."""
    nodes: dict[str, NodeTimeline] = {}
    for e in events:
        if version is not None and e.get("version") != version:
            continue
        n = nodes.setdefault(e["node"], NodeTimeline(e["node"]))
        ev, t = e["ev"], float(e["t"])
        if ev == "begin":
            n.begin, n.held0, n.addr = t, int(e["held"]), str(e.get("addr", ""))
            n.chunks = int(e["chunks"])
        elif ev == "got":
            n.got.append((t, int(e["chunk"]), str(e["src"])))
        elif ev == "ask":
            n.asked.setdefault(int(e["chunk"]), t)
        elif ev == "upstream":
            n.upstreams.append((t, e["to"], int(e["held"])))
        elif ev == "lagging":
            n.verdicts.append({**e, "t": t})
        elif ev == "failed":
            n.failed[str(e["why"])] += 1
        elif ev == "lagged_before":
            n.lagged_before = [str(a) for a in e["names"]]
        elif ev == "stalled":
            n.stalls.append((t, int(e["ticks"])))
        elif ev == "end":
            n.end, n.error = t, e.get("error")
    return nodes


def report(run: Path) -> list[dict[str, Any]]:
    """Print a run's tables, a set per version fetched in it (each step of a
    ``--steps`` run: mixed, a node's two fetches read as one); what they show, as JSON."""
    events = list(_events(run))  # (read once, whatever the steps)
    steps = _versions(events)
    if len(steps) < 2:
        return [_report_one(run, None, _timelines(events, None))]
    return [_report_one(run, v, _timelines(events, v)) for v in steps]


def _report_one(run: Path, version: int | None, nodes: dict[str, NodeTimeline]) -> dict[str, Any]:
    """The tables of one fetch per node (``version``'s, where the run holds several)."""
    if not nodes:
        raise SystemExit(f"{run}: no *.jsonl fetch traces")
    title = run.name if version is None else f"{run.name} v{version}"
    begins = [n.begin for n in nodes.values() if n.begin is not None]
    t0 = min(begins, default=min((t for n in nodes.values() for t, _, _ in n.got), default=0.0))
    names = {n.addr: n.node for n in nodes.values() if n.addr}

    def who(addr: str | None) -> str:  # (a source that traced nothing: its host)
        return "-" if addr is None else names.get(addr, addr.rpartition(":")[0] or addr)

    order = sorted(nodes.values(), key=lambda n: (n.begin or 0.0, n.node))
    rows, out_nodes = [], {}
    for n in order:
        sources = Counter(who(src) for _, _, src in n.got)
        moves = [f"{t - t0:.3f}s→{who(to)}@{held}" for t, to, held in n.upstreams]
        verdicts = [f"{v['t'] - t0:.3f}s@{v['held']} (refused {v['refused']})" for v in n.verdicts]
        rows.append(
            [
                n.node,
                f"{(n.begin or t0) - t0:.3f}",
                "-" if n.end is None else f"{n.end - t0:.3f}",
                " ".join(f"{s}:{c}" for s, c in sources.most_common()),
                " ".join(moves) or "-",
                " ".join(verdicts) or "-",
                " ".join(f"{k}:{c}" for k, c in n.failed.most_common()) or "-",
            ]
        )
        out_nodes[n.node] = {
            "begin_s": None if n.begin is None else n.begin - t0,
            "end_s": None if n.end is None else n.end - t0,
            "error": n.error,
            "chunks": n.chunks,
            "chunks_from": dict(sources),
            "upstreams": [
                {"t_s": t - t0, "to": who(to), "held": held} for t, to, held in n.upstreams
            ],
            "verdicts": [
                {"t_s": v["t"] - t0, "held": v["held"], "up": who(v.get("up")), **_told(v)}
                for v in n.verdicts
            ],
            "failed": dict(n.failed),
            "lagged_before": [who(a) for a in n.lagged_before],  # the lag memory it began on
            "stalls": [{"t_s": t - t0, "ticks": ticks} for t, ticks in n.stalls],
        }
    print_table(
        f"{title}: each link's fetch (seconds after the first began)",
        ["node", "began", "ended", "chunks from", "upstream → (t, held)", "lag verdicts", "failed"],
        rows,
        width=160,
    )
    at_verdicts: list[dict[str, Any]] = []
    for n in order:
        for v in n.verdicts:
            t = float(v["t"])
            held = {m.node: m.held_at(t) for m in order}
            at_verdicts.append({"by": n.node, "t_s": t - t0, "held": held})
    if at_verdicts:
        print_table(
            f"{title}: chunks each link held when one judged itself lagging",
            ["verdict", "at (s)", *(m.node for m in order)],
            [[v["by"], v["t_s"], *v["held"].values()] for v in at_verdicts],
            width=160,
        )
    links = trails(order, who)
    if links:
        print_table(
            f"{title}: how far each link trailed the one it took most chunks from (ms)",
            [
                "link",
                "chunks",
                "trail, first 16",
                "trail, last 16",
                "growth / chunk",
                "asked ahead",
            ],
            [
                [
                    f"{k['up']} → {k['node']}",
                    k["chunks"],
                    f"{k['first_ms']:.0f}",
                    f"{k['last_ms']:.0f}",
                    f"{k['growth_ms_per_chunk']:+.2f}",
                    f"{100 * k['asked_ahead']:.0f} %",
                ]
                for k in links
            ],
            width=160,
        )
    out: dict[str, Any] = {
        "run": run.name,
        "nodes": out_nodes,
        "at_verdicts": at_verdicts,
        "trails": links,
    }
    return out if version is None else {**out, "version": version}


TRAIL_SPAN = 16
"""Chunks at each end of a link's fetch whose median trail is reported."""


def trails(order: list[NodeTimeline], who: Callable[[str | None], str]) -> list[dict[str, Any]]:
    """For each node and the traced node it took most of its chunks from (its upstream):
    how long after the upstream held each chunk the node held it, over the chunks it took
    from there, as the medians of the first and last ``TRAIL_SPAN`` and the growth per
    chunk between them; and the share of those chunks it asked for before the upstream held
    them (parked there and passed on as they landed, cut through). A link whose trail grows
    by a steady amount a chunk delivers below its upstream's pace all along (the first
    hop of N=8 at 1 GiB, docs/results.md, session 42); one that stays flat keeps pace."""
    held = {n.node: {c: t for t, c, _ in n.got} for n in order}
    out = []
    for n in order:
        froms = Counter(who(src) for _, _, src in n.got)
        up = next((u for u, _ in froms.most_common() if u in held and u != n.node), None)
        if up is None:
            continue
        mine = sorted((c, t) for t, c, src in n.got if who(src) == up and c in held[up])
        if len(mine) < 2 * TRAIL_SPAN:
            continue
        trail = [t - held[up][c] for c, t in mine]
        first = statistics.median(trail[:TRAIL_SPAN])
        last = statistics.median(trail[-TRAIL_SPAN:])
        ahead = sum(1 for c, _ in mine if n.asked.get(c, float("inf")) < held[up][c])
        out.append(
            {
                "node": n.node,
                "up": up,
                "chunks": len(mine),
                "first_ms": 1000 * first,
                "last_ms": 1000 * last,
                "growth_ms_per_chunk": 1000 * (last - first) / (len(mine) - TRAIL_SPAN),
                "asked_ahead": ahead / len(mine),
            }
        )
    return out


def _told(v: dict[str, Any]) -> dict[str, Any]:
    return {"refused": v.get("refused"), "told": bool(v.get("told", False))}


def runs_in(where: Path) -> list[Path]:
    """``where`` itself if it holds traces, else each subdirectory that does."""
    if any(where.glob("*.jsonl")):
        return [where]
    return sorted(d for d in where.iterdir() if d.is_dir() and any(d.glob("*.jsonl")))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("trace", help="the directory TENSORHUB_TRACE (or linerate --trace) named")
    ap.add_argument("--json", help="write what the tables show here")
    args = ap.parse_args()
    where = Path(args.trace)
    if not where.is_dir():
        raise SystemExit(f"{where}: not a directory")
    found = runs_in(where)
    if not found:
        raise SystemExit(f"{where}: no *.jsonl fetch traces in it or its subdirectories")
    write_json(args.json, {"bench": "trace_report", "runs": [x for r in found for x in report(r)]})


if __name__ == "__main__":
    main()
