"""The processes a launch starts: one trainer and the rollout workers.

Each runs a :class:`~tensorhub.Hub` with its locality, its share of the emulated WAN and
(optionally) its HTTP endpoints, and reports what happens to the launcher as events on a
queue. Compute (training steps, generation) runs in a worker thread so the node keeps
serving, voting and gossiping meanwhile. Times are ``time.monotonic()``, one clock for every
process on the machine, so the launcher can subtract one process's times from another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..core.delta import delta_model
from ..core.errors import TensorHubError
from ..core.naming import split_key
from ..demo.model import TinyLM, load_rollout_weights, rollout_weights, synthetic_batch, train_step
from ..hub import Hub, NoHolder
from ..io.loop import run
from ..io.shaping import Link
from ..io.tensors import empty_like_manifest, tensor_digests
from .topology import NodeSpec, Topology

MODEL = "policy"


@dataclass(frozen=True)
class Plan:
    """What one process needs to know (picklable: it crosses into a spawned process)."""

    topology: Topology
    node: NodeSpec
    listen: str
    seeds: list[str]
    data_dir: str
    secret: str


async def _start(plan: Plan, out: Any) -> tuple[Hub, Any]:
    t, me = plan.topology, plan.node
    hub = await Hub.start(
        me.name,
        locality=me.locality,
        listen=plan.listen,
        seeds=plan.seeds,
        voter=me.voter,
        data_dir=f"{plan.data_dir}/{me.name}" if me.voter else None,
        secret=plan.secret,
        dataplane=t.dataplane,
    )
    senders = sum(1 for n in t.nodes if n.dc == me.dc)
    links = {dc: Link(bw / senders, rtt) for dc, (bw, rtt) in t.links_from(me.dc).items()}
    hub.emulate_wan(links)  # this node's share of each WAN link
    server = None
    url = None
    if t.http:
        from ..status_http import StatusServer

        server = StatusServer(hub)
        url = await server.start()
    out.put({"event": "up", "who": me.name, "dc": me.dc, "url": url, "address": hub.address})
    return hub, server


async def _watch_leadership(hub: Hub, name: str, out: Any) -> None:
    """Tell the launcher when this voter becomes leader (for chaos: kill the leader)."""
    was = False
    while hub.raft is not None:
        now = hub.raft.is_leader
        if now and not was:
            out.put({"event": "leader", "who": name, "term": hub.raft.core.term})
        was = now
        await asyncio.sleep(0.05)


def _bytes(hub: Hub) -> dict[str, dict[str, int]]:
    """Bytes this node uploaded so far, by version of the model, then by receiving node."""
    return {
        str(v): dict(by_peer)
        for (m, v), by_peer in hub.node.upload_grants.bytes_by_version.items()
        if split_key(m)[0] in (MODEL, delta_model(MODEL))  # a version's delta counts to it
    }


async def _finish(hub: Hub, server: Any, name: str, out: Any, stop: Any) -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, stop.wait)  # others may still fetch from us
    out.put({"event": "final", "who": name, "bytes_to": _bytes(hub)})
    if server is not None:
        await server.close()
    await hub.close()


def trainer_main(plan: Plan, out: Any, stop: Any) -> None:
    t = plan.topology
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(t.model)
    opt = torch.optim.AdamW(model.parameters(), lr=t.lr)
    g = torch.Generator().manual_seed(1)

    async def main() -> None:
        hub, server = await _start(plan, out)
        leader = asyncio.ensure_future(_watch_leadership(hub, plan.node.name, out))
        for v in range(1, t.versions + 1):
            t_train = time.monotonic()
            loss = await asyncio.to_thread(
                lambda: (
                    sum(
                        train_step(model, opt, synthetic_batch(model.cfg, g))
                        for _ in range(t.train_steps)
                    )
                    / t.train_steps
                )
            )
            await asyncio.sleep(t.step_s - (time.monotonic() - t_train))  # (<= 0: none)
            weights = rollout_weights(model)
            t0 = time.monotonic()
            # With deltas, v-1 is still served here (its memory is not reused: each
            # version's weights are new tensors), so v goes out as a delta from it too.
            base = v - 1 if t.deltas and v > 1 else None
            pub = await hub.publish(MODEL, v, weights, chunk_size=t.chunk_bytes, delta_from=base)
            t1 = time.monotonic()
            # The trainer's stall: until enough full copies exist elsewhere (one, or one more
            # than chaos will kill); then its memory is its own again (unpublish returns once
            # no upload reads it, keeping a CPU copy if it would otherwise be the last holder).
            with contextlib.suppress(NoHolder):
                await hub.wait_replicated(MODEL, v, copies=t.copies_before_reuse, timeout=30)
            if base is not None:
                await hub.unpublish(MODEL, base)  # the next delta is from v
            if not t.deltas or v == t.versions:
                await hub.unpublish(MODEL, v)
            t2 = time.monotonic()
            out.put(
                {
                    "event": "published",
                    "who": plan.node.name,
                    "version": v,
                    "loss": loss,
                    "bytes": pub.manifest.total_bytes,
                    "chunks": pub.manifest.num_chunks,
                    "t_publish": t0,
                    "t_commit": t1,
                    "commit_s": t1 - t0,
                    "stall_s": t2 - t0,
                    "digests": tensor_digests(weights),
                    "bytes_to": _bytes(hub),
                }
            )
        leader.cancel()
        await _finish(hub, server, plan.node.name, out, stop)

    run(main())


def rollout_main(plan: Plan, out: Any, stop: Any) -> None:
    t = plan.topology
    torch.set_num_threads(1)
    model = TinyLM(t.model)
    prompt = torch.tensor([[5, 6, 7, 8]])

    async def main() -> None:
        hub, server = await _start(plan, out)
        leader = asyncio.ensure_future(_watch_leadership(hub, plan.node.name, out))
        into: dict[str, torch.Tensor] | None = None
        have, generated = 0, 0
        while have < t.versions:
            v = await hub.latest(MODEL)  # linearizable: the newest committed version
            if v <= have:
                if have == 0:
                    await asyncio.sleep(0.05)  # nothing to run on yet
                else:  # real inference on the weights we have, until a newer version
                    sample = await asyncio.to_thread(model.generate, prompt, 8)
                    generated += sample.shape[1] - prompt.shape[1]
                continue
            try:
                if into is None:  # register once, transfer many: reused every version
                    into = empty_like_manifest(await hub.manifest(MODEL, v, timeout=t.timeout))
                res = await hub.fetch(MODEL, v, into, timeout=t.timeout)
            except TensorHubError as e:
                # Every holder of it died (say): the version is unavailable, never wrong.
                # Go on with the weights we have; the next version will come.
                out.put(
                    {
                        "event": "fetch_failed",
                        "who": plan.node.name,
                        "version": v,
                        "error": f"{type(e).__name__}: {e}",
                    }
                )
                await asyncio.sleep(0.5)
                continue
            t_done = time.monotonic()
            load_rollout_weights(model, into)
            have = v
            out.put(
                {
                    "event": "fetched",
                    "who": plan.node.name,
                    "dc": plan.node.dc,
                    "version": v,
                    "fetch_s": res.seconds,
                    "t_done": t_done,
                    "failures": res.failures,
                    "sources": res.sources,
                    "delta_base": res.delta_base,
                    "delta_bytes": res.delta_bytes,
                    "whole_bytes": res.bytes,
                    "digests": tensor_digests(into),
                    "bytes_to": _bytes(hub),
                }
            )
        out.put({"event": "generated", "who": plan.node.name, "tokens": generated})
        leader.cancel()
        await _finish(hub, server, plan.node.name, out, stop)

    run(main())
