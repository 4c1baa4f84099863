"""Run a topology on this machine: a trainer and rollout workers as processes, an RL-style
loop of train → publish → fetch → generate, chaos if asked, and a report of what happened.

``launch(topology)`` (or ``tensorhub launch TOPOLOGY.yaml``) starts every node as its own
process, shows live progress, kills what the chaos section says to kill while versions are
moving, and ends with a summary per version and per datacenter and, if asked, JSON. Every
fetched version is compared, tensor by tensor, with the trainer's digests: a rollout
running on wrong weights would show up as a failure, never pass silently.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from ..io.files import write_json
from .backends import Backend, NodeHandle
from .backends import backend as make_backend
from .timeline import png_path, write_timeline
from .topology import Topology
from .workers import Plan, rollout_main, trainer_main

FLOW_CONTROL = ("redirected", "no_chunk", "busy", "withdrawn")
"""Request outcomes that are the protocol working (ask elsewhere or later: the publisher
redirected, the chunk is not verified there yet, the holder is busy or let go of the
version), not failures."""


class LaunchFailed(RuntimeError):
    """The run could not go on (the trainer died, or nothing happened before the timeout)."""


class _Run:
    def __init__(self, t: Topology, console: Console, progress: bool, backend: Backend) -> None:
        self.t = t
        self.console = console
        self.show = progress
        self.backend = backend
        self.out = backend.out
        self.stop = backend.stop
        self.procs: dict[str, NodeHandle] = {}
        self.urls: dict[str, str | None] = {}
        self._page_at: str | None = None  # whose cluster page was announced last
        self.names: dict[str, str] = {}  # data-plane address → node name
        self.published: dict[int, dict[str, Any]] = {}
        self.fetched: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.bytes_to: dict[str, dict[str, dict[str, int]]] = {}  # node → version → peer
        self.leader: tuple[int, str] | None = None
        self.killed: list[dict[str, Any]] = []
        self.crashed: list[str] = []
        self.have: dict[str, int] = {r.name: 0 for r in t.rollouts}
        self.generated: dict[str, int] = {}
        self.fetch_failed: list[dict[str, Any]] = []
        self.rng = random.Random(t.chaos.seed)
        self._voters = {v.name for v in t.voters}
        self.t0 = time.monotonic()

    # -- processes -----------------------------------------------------------------------------

    def start(self, data_dir: str) -> None:
        t = self.t
        listen = self.backend.listen_addresses(t.nodes)
        seeds = [listen[v.name] for v in t.voters]
        secret = os.environ.get("TENSORHUB_SECRET") or os.urandom(16).hex()
        for n in t.nodes:
            plan = Plan(t, n, listen[n.name], seeds, data_dir, secret)
            target = trainer_main if n.role == "trainer" else rollout_main
            self.procs[n.name] = self.backend.start(n, target, plan)

    def kill(self, name: str, why: str) -> None:
        p = self.procs[name]
        if p.is_alive():
            p.kill()  # SIGKILL: no goodbye, no flush
            p.join(10)
            self.killed.append({"who": name, "why": why, "t": time.monotonic() - self.t0})
            self.have.pop(name, None)
            self.console.print(f"  [red]chaos[/]: killed {name} ({why})")
            if self.urls.get(name) and self._page_at == name:
                self._announce_page()  # the page announced went with it: name a live one

    def shutdown(self) -> None:
        self.stop.set()
        deadline = time.monotonic() + 10
        alive = {n for n, p in self.procs.items() if p.is_alive()}
        finals: set[str] = set()
        while finals < alive and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self._on(self.out.get(timeout=0.2), finals)
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(5)

    # -- events --------------------------------------------------------------------------------

    def _on(self, ev: dict[str, Any], finals: set[str] | None = None) -> None:
        kind, who = ev["event"], str(ev.get("who", ""))
        if "bytes_to" in ev:
            self.bytes_to[who] = ev["bytes_to"]
        if kind == "up":
            self.urls[who] = ev["url"]
            self.names[ev["address"]] = who
            self._announce_up(who, ev["url"])
        elif kind == "leader":
            if self.leader is None or ev["term"] >= self.leader[0]:
                self.leader = (ev["term"], who)
        elif kind == "published":
            self.published[ev["version"]] = ev
        elif kind == "fetched":
            self.fetched[ev["version"]].append(ev)
            if who in self.have:
                self.have[who] = ev["version"]
        elif kind == "fetch_failed":
            self.fetch_failed.append(ev)
            self.console.print(f"  [yellow]{who}[/]: v{ev['version']} unavailable: {ev['error']}")
        elif kind == "generated":
            self.generated[who] = ev["tokens"]
        elif kind == "final" and finals is not None:
            finals.add(who)

    def _announce_up(self, who: str, url: str | None) -> None:
        """Say where to look the moment a node serves: the cluster page once (any node's
        shows the whole cluster), then each node's own dashboard."""
        up = len(self.urls)
        if url and self._page_at is None:
            self._announce_page()
        where = f": dashboard {url}" if url else ""
        self.console.print(f"  {who} is up ({up}/{len(self.t.nodes)}){where}")

    def _announce_page(self) -> None:
        """Name the cluster page of a live node (any node's shows the whole cluster)."""
        live = [n for n, u in self.urls.items() if u and self.procs[n].is_alive()]
        self._page_at = live[0] if live else None
        if self._page_at is not None:
            url = self.urls[self._page_at]
            self.console.print(f"Cluster page: [bold]{url}/cluster[/] (every node serves it)")

    def _chaos_after(self, version: int) -> None:
        c, t = self.t.chaos, self.t
        # Rollout kills are spread over the versions; each lands while fetches are running.
        # Chaos never takes the voters below a majority (that is an outage, not a fault to
        # ride out); the leader goes first, random kills then take what is left to take.
        if c.kill_leader and version == max(1, t.versions // 2) and self.leader is not None:
            leader = self.leader[1]
            if leader != t.trainer.name and self.procs[leader].is_alive() and self._spare_voter():
                self.kill(leader, f"chaos: Raft leader (term {self.leader[0]})")
        for i in range(c.kill_rollouts):
            if 1 + i * t.versions // max(c.kill_rollouts, 1) == version:
                live = sorted(
                    n
                    for n in self.have
                    if self.procs[n].is_alive() and (n not in self._voters or self._spare_voter())
                )
                if len(live) > 1:
                    self.kill(self.rng.choice(live), f"chaos: random rollout after v{version}")

    def _spare_voter(self) -> bool:
        """Whether one more voter may die with a majority of the voters left alive."""
        alive = sum(1 for v in self._voters if self.procs[v].is_alive())
        return alive - 1 > len(self._voters) // 2

    def loop(self) -> None:
        t = self.t
        deadline = time.monotonic() + t.timeout
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} rollouts"),
            console=self.console,
            disable=not self.show,
        )
        tasks: dict[int, Any] = {}

        def task(v: int) -> Any:
            if v not in tasks:  # fetches may be reported before the trainer's stall ends
                tasks[v] = bar.add_task(f"v{v} fetched by", total=len(self.have))
            return tasks[v]

        with bar:
            while not self._done():
                if time.monotonic() > deadline:
                    raise LaunchFailed(f"timed out after {t.timeout:.0f}s: {self._where()}")
                try:
                    ev = self.out.get(timeout=0.5)
                except queue.Empty:
                    self._check_processes()
                    continue
                self._on(ev)
                if ev["event"] == "published":
                    v = ev["version"]
                    self.console.print(
                        f"  v{v}: trained (loss {ev['loss']:.3f}), published "
                        f"{ev['bytes'] / 2**20:.1f} MiB; trainer stalled "
                        f"{ev['stall_s'] * 1e3:.0f} ms"
                    )
                    task(v)
                    self._chaos_after(v)
                elif ev["event"] == "fetched":
                    bar.advance(task(ev["version"]))

    def _done(self) -> bool:
        return len(self.published) == self.t.versions and all(
            v >= self.t.versions for v in self.have.values()
        )

    def _where(self) -> str:
        return f"published {sorted(self.published)}, rollouts at {self.have}"

    def _check_processes(self) -> None:
        for name, p in self.procs.items():
            if p.exitcode is not None and name not in {k["who"] for k in self.killed}:
                if name == self.t.trainer.name:
                    raise LaunchFailed(f"the trainer exited ({p.exitcode}): {self._where()}")
                if name not in self.crashed:
                    self.crashed.append(name)
                    self.have.pop(name, None)
                    self.console.print(f"  [red]{name} exited[/] ({p.exitcode})")

    # -- report --------------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        t = self.t
        dc_of = {n.name: n.dc for n in t.nodes}
        links: Counter[str] = Counter()
        node_links: Counter[str] = Counter()
        # Per version, counted by the receivers (a killed sender's last uploads would be
        # missing from its own counters): the bytes each rollout's fetch took from whom.
        per_version: dict[int, Counter[str]] = defaultdict(Counter)
        for v, fs in self.fetched.items():
            for f in fs:
                for addr, n in f.get("sources", {}).items():
                    src = self.names.get(addr, "?")
                    per_version[v][f"{dc_of.get(src, '?')}>{dc_of.get(f['who'], '?')}"] += n
        for sender, by_version in self.bytes_to.items():
            for by_peer in by_version.values():
                for peer, n in by_peer.items():
                    dc_link = f"{dc_of.get(sender, '?')}>{dc_of.get(peer, '?')}"
                    links[dc_link] += n
                    node_links[f"{sender}>{peer}"] += n
        versions = []
        wrong = 0
        for v, pub in sorted(self.published.items()):
            fetches = []
            for f in sorted(self.fetched.get(v, []), key=lambda f: f["who"]):
                ok = f["digests"] == pub["digests"]
                wrong += not ok
                fetches.append(
                    {
                        "who": f["who"],
                        "dc": f["dc"],
                        "fetch_s": f["fetch_s"],
                        "stall_s": f["t_done"] - pub["t_commit"],
                        "failures": f["failures"],
                        "verified": ok,
                        "delta_base": f.get("delta_base"),
                        "delta_bytes": f.get("delta_bytes", 0),
                    }
                )
            versions.append(
                {
                    "version": v,
                    "bytes_received_by_dc_link": dict(sorted(per_version[v].items())),
                    # Per datacenter: what this version (its delta included) took across
                    # the WAN into it, in models.
                    "wan_in_models_by_dc": {
                        dc: sum(n for k, n in per_version[v].items() if _crosses_into(k, dc))
                        / pub["bytes"]
                        for dc in t.datacenters
                    },
                    "loss": pub["loss"],
                    "bytes": pub["bytes"],
                    "published_at_s": pub["t_publish"] - self.t0,  # (since the launch began)
                    "commit_s": pub["commit_s"],
                    "trainer_stall_s": pub["stall_s"],
                    "fetches": fetches,
                }
            )
        model_bytes = mean(p["bytes"] for p in self.published.values()) if self.published else 0
        received: Counter[str] = Counter()
        for by_link in per_version.values():
            received.update(by_link)
        remote_in = {
            dc: sum(n for k, n in received.items() if _crosses_into(k, dc)) for dc in t.datacenters
        }
        requests: Counter[str] = Counter()
        for fs in self.fetched.values():
            for f in fs:
                requests.update(f["failures"])
        deferred = sum(requests[k] for k in FLOW_CONTROL)
        failed_requests = sum(requests.values()) - deferred
        return {
            "topology": {
                "nodes": [vars(n) for n in t.nodes],
                "wan": [vars(w) for w in t.wan],
                "model": vars(t.model),
                "versions": t.versions,
            },
            "versions": versions,
            "bytes_received_by_dc_link": dict(sorted(received.items())),
            "bytes_uploaded_by_dc_link": dict(sorted(links.items())),
            "bytes_uploaded_by_node_link": dict(sorted(node_links.items())),
            "wan_bytes_in_by_dc": remote_in,
            "wan_bytes_in_per_version_in_models": {
                dc: (b / len(versions) / model_bytes if versions and model_bytes else 0.0)
                for dc, b in remote_in.items()
            },
            "model_bytes": model_bytes,
            "tokens_generated": self.generated,
            "dashboards": self.urls,
            "chaos": {"killed": self.killed, "crashed": self.crashed},
            "fetch_failures": self.fetch_failed,
            "failures": {
                "killed": len(self.killed),
                "crashed": len(self.crashed),
                "failed_fetches": len(self.fetch_failed),
                "failed_requests_retried": failed_requests,
                "deferred_requests": deferred,
                "requests_by_outcome": dict(requests),
                "wrong_weights": wrong,
            },
            "ok": wrong == 0 and len(versions) == t.versions and not self.crashed,
            "wall_s": time.monotonic() - self.t0,
            "dataplane": t.dataplane,
        }


def _crosses_into(dc_link: str, dc: str) -> bool:
    """Whether a "src_dc>dst_dc" link is a WAN link into ``dc``."""
    src, _, dst = dc_link.partition(">")
    return dst == dc and src != dc


def summary(res: dict[str, Any], console: Console) -> None:
    """The human report: per version, then per datacenter, then failures."""
    vt = Table(title=f"tensorhub launch: what happened ({res['wall_s']:.0f} s)")
    cols = ["ver", "loss", "MiB", "trainer stall ms", "fetched", "verified", "max stall ms"]
    for col in [*cols, "WAN in (models, most into one DC)", "by delta"]:
        vt.add_column(col, justify="right")
    for v in res["versions"]:
        fs = v["fetches"]
        vt.add_row(
            str(v["version"]),
            f"{v['loss']:.3f}",
            f"{v['bytes'] / 2**20:.1f}",
            f"{v['trainer_stall_s'] * 1e3:.0f}",
            str(len(fs)),
            "yes" if all(f["verified"] for f in fs) else "NO",
            f"{max((f['stall_s'] for f in fs), default=0) * 1e3:.0f}",
            f"{max(v['wan_in_models_by_dc'].values(), default=0):.3f}",
            f"{sum(f['delta_base'] is not None for f in fs)}/{len(fs)}",
        )
    console.print(vt)
    console.print(
        "[dim]stall: how long a process waited on weights. The trainer's: from publish until "
        "it may train on (enough copies exist elsewhere); a rollout's: from the version's "
        "commit until it holds the version, verified.[/]"
    )
    dt = Table(title="per datacenter (rollouts)")
    for col in (
        "dc",
        "fetches",
        "mean fetch ms",
        "mean stall ms",
        "max stall ms",
        "WAN in MiB",
        "WAN in / version (models)",
    ):
        dt.add_column(col, justify="right")
    by_dc: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for v in res["versions"]:
        for f in v["fetches"]:
            by_dc[f["dc"]].append(f)
    for dc, wan_in in sorted(res["wan_bytes_in_by_dc"].items()):
        fs = by_dc.get(dc, [])
        dt.add_row(
            dc,
            str(len(fs)),
            f"{mean(f['fetch_s'] for f in fs) * 1e3:.0f}" if fs else "-",
            f"{mean(f['stall_s'] for f in fs) * 1e3:.0f}" if fs else "-",
            f"{max(f['stall_s'] for f in fs) * 1e3:.0f}" if fs else "-",
            f"{wan_in / 2**20:.1f}",
            f"{res['wan_bytes_in_per_version_in_models'].get(dc, 0):.2f}",
        )
    console.print(dt)
    f = res["failures"]
    console.print(
        f"Failures: {f['killed']} killed by chaos, {f['crashed']} crashed, "
        f"{f['failed_fetches']} fetches failed (version unavailable), "
        f"{f['failed_requests_retried']} chunk requests failed (holder lost, corrupt, timed "
        f"out) and were retried elsewhere, {f['deferred_requests']} were asked again "
        "elsewhere or later (the publisher pointed to a node that already had the chunk, or "
        "the holder was busy or had not verified it yet), "
        f"[bold]{f['wrong_weights']} rollouts on wrong weights[/] (every fetch is checked "
        "against the trainer's digests)."
    )


def launch(
    topology: Topology,
    *,
    json_path: str | Path | None = None,
    progress: bool = True,
    console: Console | None = None,
    backend: str = "process",
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run ``topology`` to the end; returns the results (also written to ``json_path``).
    ``backend``: "process" (local processes) or "ray" (actors on the Ray cluster at
    ``ray_address``; None starts a local one)."""
    console = console or Console()
    t = topology
    console.print(
        f"[bold]tensorhub launch[/]: {len(t.nodes)} processes in "
        f"{len(t.datacenters)} datacenters ({', '.join(t.datacenters)}); trainer "
        f"{t.trainer.name}; Raft voters {', '.join(v.name for v in t.voters)}; "
        f"{t.versions} versions; data plane {t.dataplane}"
        + (
            "; WAN "
            + ", ".join(
                f"{w.a}-{w.b} {w.bandwidth * 8 / 1e9:g} Gbit/s {w.rtt * 1e3:g} ms" for w in t.wan
            )
            if t.wan
            else "; WAN not shaped"
        )
    )
    nodes = make_backend(backend, ray_address)
    run = _Run(t, console, progress, nodes)
    with tempfile.TemporaryDirectory(prefix="tensorhub-launch-") as data:
        where = "Ray actors" if backend == "ray" else "processes"
        console.print(f"Starting {len(t.nodes)} {where} (each imports torch: ~10-30 s)…")
        try:
            run.start(data)
            run.loop()
        finally:
            run.shutdown()
            nodes.close()
    res = run.results()
    if t.http:
        urls = [u for u in res["dashboards"].values() if u]
        if urls:
            console.print(
                f"The cluster page and dashboards (e.g. {urls[0]}/cluster) went with the run."
            )
    summary(res, console)
    if json_path is not None:
        write_json(json_path, res)
        png = write_timeline(res, png_path(json_path))
        console.print(
            f"Results: {json_path}"
            + (f", timeline {png}" if png else " (for a PNG timeline: pip install matplotlib)")
        )
    return res
