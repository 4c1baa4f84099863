"""Per-node HTTP endpoints for operators: ``/status`` (JSON), ``/metrics`` (Prometheus
text format) and ``/`` (a live dashboard of versions, holders and transfers).

Read-only and built from what the node already knows (its gossip view, its replicas, its
Raft state), so any node answers for the whole cluster's versions and holders. Metrics are
collected at scrape time by a collector over the Hub, in a registry of the node's own (no
process-global state, so several Hubs in one process do not collide).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .hub import Hub


def status(hub: Hub) -> dict[str, Any]:
    """A JSON-able picture of the node and of the cluster as it sees it."""
    core = hub.gossip.core
    versions = []
    for model, version in core.holders.versions():
        holders = []
        for name, h in sorted(core.holders.holders(model, version).items()):
            held = sum(h.has(i) for i in range(h.num_chunks))
            holders.append(
                {
                    "name": name,
                    "locality": core.locality_of(name),
                    "chunks": held,
                    "of": h.num_chunks,
                    "complete": held == h.num_chunks,
                    "origin": h.origin,
                }
            )
        versions.append({"model": model, "version": version, "holders": holders})
    return {
        "name": hub.node.name,
        "address": hub.address,
        "locality": hub.locality,
        "time": time.time(),
        "raft": hub.raft.status() if hub.raft is not None else None,
        "members": [
            {"name": n, "locality": core.locality_of(n), "status": str(core.status(n))}
            for n in sorted(core.alive())
        ],
        "versions": versions,
        "replicas": [
            {"model": r.model, "version": r.version, "chunks": r.held, "of": len(r.have)}
            for r in hub.node.store
        ],
        "uploads": {
            "bytes_to": dict(hub.node.uploads.bytes_to),
            "active": hub.node.uploads.policy.active,
            "waiting": hub.node.uploads.policy.waiting,
            "refused": hub.node.uploads.policy.refused,
        },
        "fetches": [
            {
                "model": f.model,
                "version": f.version,
                "bytes": f.bytes,
                "seconds": f.seconds,
                "failures": f.failures,
            }
            for f in hub.fetches
        ],
        "fetch_totals": dict(hub.fetch_totals),
    }


class HubCollector(Collector):
    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Any]:
        hub = self.hub
        up = CounterMetricFamily(
            "tensorhub_upload_bytes", "Chunk bytes uploaded, by receiving node", labels=["peer"]
        )
        for peer, n in sorted(hub.node.uploads.bytes_to.items()):
            up.add_metric([peer], n)
        yield up
        totals = hub.fetch_totals
        yield CounterMetricFamily("tensorhub_fetches", "Completed fetches", totals["fetches"])
        yield CounterMetricFamily(
            "tensorhub_fetch_bytes", "Bytes received by completed fetches", totals["bytes"]
        )
        yield CounterMetricFamily(
            "tensorhub_fetch_failed_requests",
            "Chunk requests that failed and were retried elsewhere",
            totals["failed_requests"],
        )
        yield CounterMetricFamily(
            "tensorhub_fetches_failed", "Fetches that failed", totals["failed"]
        )
        yield GaugeMetricFamily(
            "tensorhub_replicas", "Versions held in memory here", len(hub.node.store)
        )
        yield GaugeMetricFamily(
            "tensorhub_members_alive",
            "Live members in the gossip view",
            len(hub.gossip.core.alive()),
        )
        slots = hub.node.uploads.policy
        yield GaugeMetricFamily("tensorhub_upload_slots_active", "Uploads running", slots.active)
        yield GaugeMetricFamily(
            "tensorhub_upload_waiting", "Uploads waiting for a slot", slots.waiting
        )
        if hub.raft is not None:
            st = hub.raft.status()
            yield GaugeMetricFamily("tensorhub_raft_term", "Current Raft term", float(st["term"]))  # type: ignore[arg-type]
            yield GaugeMetricFamily(
                "tensorhub_raft_leader", "1 if this voter leads", 1.0 if hub.raft.is_leader else 0.0
            )
            yield GaugeMetricFamily(
                "tensorhub_raft_commit_index",
                "Raft commit index",
                float(st["commit"]),  # type: ignore[arg-type]
            )


def app(hub: Hub) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(hub))
    page = resources.files("tensorhub").joinpath("dashboard.html").read_text()

    async def get_status(_req: web.Request) -> web.Response:
        return web.json_response(status(hub))

    async def get_metrics(_req: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async def get_dashboard(_req: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    a = web.Application()
    a.router.add_get("/status", get_status)
    a.router.add_get("/metrics", get_metrics)
    a.router.add_get("/", get_dashboard)
    return a


class StatusServer:
    """Serve :func:`app` for ``hub`` on ``host:port`` (port 0: any free one)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        sock = socket.create_server((host, port))
        self._runner = web.AppRunner(app(self.hub), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        h, p = sock.getsockname()[:2]
        self.url = f"http://{h}:{p}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
