"""Per-node HTTP endpoints for operators: ``/status`` (JSON), ``/metrics`` (Prometheus
text format), ``/`` (a live dashboard of this node: versions, holders and transfers) and
``/cluster`` (the whole cluster per datacenter, :mod:`tensorhub.cluster_view`; JSON at
``/cluster.json``).

Read-only and built from what the node already knows (its gossip view, its replicas, its
Raft state), so any node answers for the whole cluster's versions and holders. Metrics are
collected at scrape time by a collector over the Hub, in a registry of the node's own (no
process-global state, so several Hubs in one process do not collide).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .cluster_view import SpreadRate, summarize
from .core.errors import TensorHubError
from .core.histogram import Histogram
from .core.naming import shard_key, split_key
from .hub import Hub


def status(hub: Hub) -> dict[str, Any]:
    """A JSON-able picture of the node and of the cluster as it sees it."""
    core = hub.gossip.core
    versions = []
    for model, version in core.holders.versions():
        holders = []
        for name, h in sorted(core.holders.holders(model, version).items()):
            held = h.held
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
            {
                "name": n,
                "locality": core.locality_of(n),
                "status": st.name.lower() if (st := core.status(n)) is not None else "unknown",
            }
            for n in sorted(core.members.names())
        ],
        "versions": versions,
        "replicas": [
            {"model": r.key, "version": r.version, "chunks": r.held, "of": len(r.have)}
            for r in hub.node.store
        ],
        "uploads": {
            "bytes_to": dict(hub.node.upload_grants.bytes_to),
            "active": hub.node.upload_grants.policy.active,
            "waiting": hub.node.upload_grants.policy.waiting,
            "refused": hub.node.upload_grants.policy.refused,
        },
        "fetches": [
            {
                "model": f.key,
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
        for peer, n in sorted(hub.node.upload_grants.bytes_to.items()):
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
        slots = hub.node.upload_grants.policy
        yield GaugeMetricFamily(
            "tensorhub_upload_slots_active", "UploadGrants running", slots.active
        )
        yield GaugeMetricFamily(
            "tensorhub_upload_waiting", "UploadGrants waiting for a slot", slots.waiting
        )
        yield from _histograms(
            "tensorhub_fetch_seconds",
            "Successful fetches: seconds from the call to every chunk verified",
            hub.fetch_seconds,
        )
        yield from _histograms(
            "tensorhub_fetch_manifest_seconds",
            "Seconds a fetch waited for the version's manifest",
            hub.manifest_seconds,
        )
        yield from _histograms(
            "tensorhub_chunk_seconds",
            "Chunk requests of successful fetches: seconds from request to verified",
            hub.chunk_seconds,
        )
        yield from _histograms(
            "tensorhub_publisher_stall_seconds",
            "Seconds wait_replicated held the publisher until enough copies existed elsewhere",
            hub.replicate_seconds,
        )
        latest = GaugeMetricFamily(
            "tensorhub_latest_version",
            "Newest version this node knows to be committed",
            labels=["model"],
        )
        for model, v in sorted(hub.committed.items()):
            latest.add_metric([model], v)
        yield latest
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


def _histograms(name: str, doc: str, per_model: Mapping[str, Histogram]) -> Iterator[Any]:
    fam = HistogramMetricFamily(name, doc, labels=["model"])
    for model, h in sorted(per_model.items()):
        fam.add_metric([model], h.cumulative(), h.total)
    yield fam


async def cluster(hub: Hub, rate: SpreadRate) -> dict[str, Any]:
    """:func:`~tensorhub.cluster_view.summarize` for ``hub``, with the registry's latest
    version of every model it sees (asked at once, each within a second; a voter that does
    not answer leaves the holders' newest version shown instead)."""
    core = hub.gossip.core
    held = core.holders.versions()
    models = {split_key(dp)[0] for dp, _v in held}
    models |= set(hub.committed)

    async def ask(model: str) -> tuple[str, int | None]:
        try:
            return model, await hub.latest(model, timeout=1.0)
        except TensorHubError:
            return model, None

    answers = await asyncio.gather(*(ask(m) for m in sorted(models)))
    latest = {m: v for m, v in answers if v}
    committed = {dp: latest[m] for dp, _v in held if (m := split_key(dp)[0]) in latest}
    committed.update(
        {shard_key(m, 0): v for m, v in latest.items() if shard_key(m, 0) not in committed}
    )
    chunk_bytes = {
        (r.key, r.version): r.manifest.total_bytes / max(1, r.manifest.num_chunks)
        for r in hub.node.store
    }
    return summarize(core, committed, chunk_bytes, rate, time.time())


def app(hub: Hub) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(hub))
    files = resources.files("tensorhub")
    page = files.joinpath("dashboard.html").read_text()
    cluster_page = files.joinpath("cluster.html").read_text()
    rate = SpreadRate()

    async def get_status(_req: web.Request) -> web.Response:
        return web.json_response(status(hub))

    async def get_metrics(_req: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    async def get_dashboard(_req: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    async def get_cluster_json(_req: web.Request) -> web.Response:
        return web.json_response(await cluster(hub, rate))

    async def get_cluster(_req: web.Request) -> web.Response:
        return web.Response(text=cluster_page, content_type="text/html")

    a = web.Application()
    a.router.add_get("/status", get_status)
    a.router.add_get("/metrics", get_metrics)
    a.router.add_get("/cluster.json", get_cluster_json)
    a.router.add_get("/cluster", get_cluster)
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
