"""Fan-out: one publisher, R fetchers in two datacenters, swarm against star, same run.

Every node is a separate process on loopback running a full :class:`tensorhub.Hub` (the
publisher and one fetcher per datacenter are the Raft voters). Half the fetchers share the
publisher's datacenter, half are in the other. Three phases, on the same processes:

1. **point to point**: one fetcher pulls the model from the publisher alone — the time one
   copy takes on this machine now (the lower bound of any fan-out's last fetcher);
2. **star** (the baseline): all R fetchers pull from the publisher at once, as with a
   central store or a trainer serving every rollout;
3. **swarm**: the publisher publishes through the Hub (it super-seeds), and all R fetchers
   ``Hub.fetch`` at once: locality-aware, chunks passed on as soon as verified.

Reported, each as a ratio measured in this run: the publisher's egress / model size;
cross-datacenter bytes / model size per remote datacenter; last fetcher's completion time /
the point-to-point time. The WAN is not shaped here (loopback): the cross-datacenter figure
counts bytes by the localities of sender and receiver.

    python bench/fanout.py --fetchers 8 --size 128MiB --json out/fanout.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import multiprocessing.connection as mpc
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_size, print_table, write_json
from bench.p2p import make_state_dict
from tensorhub.core.layout import DEFAULT_CHUNK_SIZE
from tensorhub.hub import Hub
from tensorhub.io.loop import run
from tensorhub.io.tcp import free_ports
from tensorhub.io.tensors import empty_like_manifest

SECRET = "bench-fanout"
MODEL = "bench"


async def _serve_commands(hub: Hub, pipe: mpc.Connection, size: int) -> None:
    """One process's command loop: the parent drives the phases through ``pipe``."""
    loop = asyncio.get_running_loop()
    weights: dict[str, Any] = {}
    while True:
        cmd, *args = await loop.run_in_executor(None, pipe.recv)
        if cmd == "stop":
            return
        if cmd == "serve":  # the publisher: a plain holder (phases 1 and 2)
            (name,) = args
            weights[name] = make_state_dict(size, seed=len(weights))
            hub.node.serve(name, 1, weights[name])
            pipe.send(("ok",))
        elif cmd == "publish":  # the publisher, through the Hub (phase 3)
            weights[MODEL] = make_state_dict(size, seed=99)
            await hub.publish(MODEL, 1, weights[MODEL])
            pipe.send(("ok",))
        elif cmd == "prepare":  # a fetcher: allocate destination tensors (not timed)
            name, addr = args
            if addr is None:
                m = await hub.manifest(name, 1)
            else:
                m = await (await hub.node.peer(addr)).get_manifest(name, 1)
            weights[name] = empty_like_manifest(m)
            pipe.send(("ok",))
        elif cmd == "fetch":  # a fetcher: timed; addr None means through the Hub (swarm)
            name, addr = args
            t0 = time.monotonic()
            if addr is None:
                await hub.fetch(name, 1, weights[name])
            else:
                await hub.node.fetch(addr, name, 1, weights[name], hold=False)
            pipe.send(("done", t0, time.monotonic()))
        elif cmd == "stats":
            pipe.send(("stats", dict(hub.node.uploads.bytes_to)))
        else:
            pipe.send(("error", f"unknown command {cmd!r}"))


def _child(
    name: str,
    locality: str,
    listen: str,
    seeds: list[str],
    voter: bool,
    data_dir: str,
    size: int,
    pipe: mpc.Connection,
) -> None:
    async def main() -> None:
        hub = await Hub.start(
            name,
            locality=locality,
            listen=listen,
            seeds=seeds,
            voter=voter,
            data_dir=data_dir if voter else None,
            secret=SECRET,
        )
        pipe.send(("ready", hub.address))
        try:
            await _serve_commands(hub, pipe, size)
        finally:
            await hub.close()

    run(main())


class Cluster:
    """The processes and their pipes."""

    def __init__(self, fetchers: int, size: int, tmp: str) -> None:
        ctx = mp.get_context("spawn")
        self.names = ["publisher"] + [f"f{i}" for i in range(fetchers)]
        half = (fetchers + 1) // 2
        self.dc = {"publisher": "dc0"} | {
            f"f{i}": "dc0" if i < half else "dc1" for i in range(fetchers)
        }
        voters = ["publisher", "f0", f"f{half}"] if fetchers > half else ["publisher", "f0"]
        ports = dict(zip(voters, free_ports(len(voters)), strict=True))
        seeds = [f"127.0.0.1:{ports[v]}" for v in voters]
        self.pipes: dict[str, mpc.Connection] = {}
        self.procs: list[Any] = []
        for i, n in enumerate(self.names):
            ours, theirs = ctx.Pipe()
            listen = f"127.0.0.1:{ports[n]}" if n in ports else "127.0.0.1:0"
            p = ctx.Process(
                target=_child,
                args=(
                    n,
                    f"{self.dc[n]}/rack{i % 2}/{n}",
                    listen,
                    seeds,
                    n in ports,
                    f"{tmp}/{n}",
                    size,
                    theirs,
                ),
                daemon=True,
            )
            p.start()
            self.pipes[n], self.procs = ours, [*self.procs, p]
        self.addr = {n: self._expect(n, "ready")[0] for n in self.names}

    def _expect(self, name: str, tag: str) -> list[Any]:
        if not self.pipes[name].poll(300):
            raise TimeoutError(f"{name} did not answer")
        got, *rest = self.pipes[name].recv()
        if got != tag:
            raise RuntimeError(f"{name}: expected {tag}, got {got} {rest}")
        return list(rest)

    def call(self, names: list[str], *cmd: Any, tag: str = "ok") -> list[list[Any]]:
        for n in names:
            self.pipes[n].send(cmd)
        return [self._expect(n, tag) for n in names]

    def egress(self) -> Counter[str]:
        """Bytes each node uploaded to each other node so far: (sender>receiver) → bytes."""
        out: Counter[str] = Counter()
        for n, (by_peer,) in zip(
            self.names, self.call(self.names, "stats", tag="stats"), strict=True
        ):
            for peer, b in by_peer.items():
                out[f"{n}>{peer}"] += b
        return out

    def close(self) -> None:
        for n in self.names:
            self.pipes[n].send(("stop",))
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def _phase(
    c: Cluster, fetchers: list[str], model: str, via: str | None, size: int
) -> dict[str, Any]:
    before = c.egress()
    c.call(fetchers, "prepare", model, via)
    times = c.call(fetchers, "fetch", model, via, tag="done")
    after = c.egress()
    delta = after - before
    pub = sum(b for k, b in delta.items() if k.startswith("publisher>"))
    cross = sum(b for k, b in delta.items() if c.dc[k.split(">")[0]] != c.dc[k.split(">")[1]])
    remote_dcs = len({c.dc[f] for f in fetchers} - {"dc0"}) or 1
    return {
        "seconds": max(t1 for _t0, t1 in times) - min(t0 for t0, _t1 in times),
        "publisher_egress_models": pub / size,
        "cross_dc_models_per_remote_dc": cross / size / remote_dcs,
        "fetchers": len(fetchers),
        "bytes_by_link": dict(sorted(delta.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fetchers", type=int, default=8)
    ap.add_argument("--size", default="128MiB", help="model bytes (e.g. 64MiB, 1GiB)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(prefix="tensorhub-fanout-") as tmp:
        c = Cluster(args.fetchers, size, tmp)
        try:
            fetchers = [n for n in c.names if n != "publisher"]
            c.call(["publisher"], "serve", "p2p")
            c.call(["publisher"], "serve", "star")
            p2p = _phase(c, ["f0"], "p2p", c.addr["publisher"], size)
            star = _phase(c, fetchers, "star", c.addr["publisher"], size)
            c.call(["publisher"], "publish")
            swarm = _phase(c, fetchers, MODEL, None, size)
        finally:
            c.close()
    model_bytes = size  # make_state_dict pads to about ``size``
    for r in (star, swarm):
        r["last_fetcher_over_p2p"] = r["seconds"] / p2p["seconds"]
    rows = [
        [
            name,
            r["publisher_egress_models"],
            r["cross_dc_models_per_remote_dc"],
            r["seconds"],
            r["last_fetcher_over_p2p"],
        ]
        for name, r in (("star (baseline)", star), ("tensorhub swarm", swarm))
    ]
    print_table(
        f"fan-out: 1 publisher → {args.fetchers} fetchers in 2 DCs, model {size / 2**20:.0f} MiB;"
        f" one p2p copy {p2p['seconds']:.2f}s",
        [
            "",
            "publisher egress (models)",
            "cross-DC (models/remote DC)",
            "last fetcher (s)",
            "last / p2p",
        ],
        rows,
    )
    write_json(
        args.json,
        {
            "bench": "fanout",
            "model_bytes": model_bytes,
            "chunk_bytes": DEFAULT_CHUNK_SIZE,
            "fetchers": args.fetchers,
            "p2p_seconds": p2p["seconds"],
            "star": star,
            "swarm": swarm,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
