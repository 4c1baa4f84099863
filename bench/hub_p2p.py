"""Point to point through the Hub: ``Hub.publish`` + ``Hub.fetch`` against a raw socket.

``bench/p2p.py`` measures the transport (``Node.fetch`` of a version a node serves); what
a trainer and a rollout pay is more: the publisher digests every byte and commits the
version through Raft, the fetcher reads the committed manifest from the registry, finds
the holder through gossip and runs the swarm's fetch loop. #17 asks the whole of it at
0.95x the raw socket or better.

Two processes on loopback. The publisher is a Raft voter (the registry) holding a
state_dict of real tensors (``--size`` bytes) and a raw socket sender of the same bytes;
the fetcher is a Hub of its own. Each run publishes a new version of the same tensors
(CPU tensors are served in place: no copy) and the fetcher fetches it into the same
preallocated tensors; interleaved with it, the baseline receives the same bytes over a
blocking socket (``sendall`` of 1 MiB slices into ``recv_into``, as bench/p2p.py).
Reported: the median over pairs of raw time / (publish + fetch) time, and of raw / fetch
alone. After the last run the fetched tensors' digests are compared with the
publisher's.

``--net netns --rate 1000`` runs the same two processes on NIC-limited nodes instead, each
in a network namespace of its own behind a 1 Gbit/s veth (tensorhub/testing/netns.py;
root needed). On loopback this 2-core host runs out of CPU first: the raw copy keeps both
cores busy, so every byte the Hub verifies is time added. Across a NIC, what the Hub adds
to a copy is what a trainer and a rollout on two machines pay.

    python bench/hub_p2p.py --size 1GiB --runs 7 --json out/hub_p2p.json
    python bench/hub_p2p.py --size 1GiB --runs 3 --net netns --rate 1000 --cc cubic
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, parse_size, print_table, write_json
from bench.p2p import _raw_sender, raw_receive
from tensorhub import Hub
from tensorhub.io.loop import run
from tensorhub.io.tcp import CONGESTION_ENV, local_addresses
from tensorhub.io.tensors import byte_view, empty_like_manifest, tensor_digests
from tensorhub.testing.netns import Fabric, enter, unavailable
from tensorhub.testing.weights import llm_like_state_dict

SECRET = "bench-secret"
MODEL = "bench"
PORT = 7100  # (--net netns: the namespaces are ours, nothing else listens in them)


def publisher_main(
    size: int, addr: str, ns: str | None, data_dir: str, cmds: Any, replies: Any
) -> None:
    """The trainer's side: a voter Hub that publishes what it is told to, and the raw
    sender of the same bytes (on the Hub's host: in its namespace, with ``ns``)."""
    if ns is not None:
        enter(ns)
    sd = llm_like_state_dict(size)
    raw = socket.create_server((addr.rpartition(":")[0], 0))
    views = [byte_view(t) for t in sd.values()]
    threading.Thread(target=_raw_sender, args=(raw, views), daemon=True).start()

    async def main() -> None:
        hub = await Hub.start(
            "publisher", listen=addr, seeds=[addr], voter=True, data_dir=data_dir, secret=SECRET
        )
        loop = asyncio.get_running_loop()
        replies.put(("ready", raw.getsockname()[1], tensor_digests(sd)))
        try:
            while True:
                cmd, version = await loop.run_in_executor(None, cmds.get)
                if cmd == "stop":
                    return
                if version > 1:  # one version served at a time, as a trainer would
                    await hub.unpublish(MODEL, version - 1, keep_copy=False)
                t0 = time.perf_counter()
                await hub.publish(MODEL, version, sd)
                replies.put(("published", time.perf_counter() - t0))
        finally:
            await hub.close()

    run(main())


def fetcher_main(
    ns: str, listen: str, addr: str, raw_port: int, runs: int, cmds: Any, replies: Any, out: Any
) -> None:
    """The rollout's side in a namespace of its own (``--net netns``)."""
    enter(ns)
    out.put(run(_fetcher(addr, raw_port, runs, cmds, replies, listen)))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1GiB", help="bytes of tensors to move (e.g. 1GiB)")
    ap.add_argument("--runs", type=int, default=7, help="timed pairs (after 1 warm-up)")
    ap.add_argument(
        "--net",
        default="loopback",
        choices=["loopback", "netns"],
        help="loopback, or a network namespace per process behind a --rate NIC (root)",
    )
    ap.add_argument("--rate", type=float, default=1000, help="--net netns: NIC Mbit/s")
    ap.add_argument("--cc", help="TCP congestion control of every connection (host default)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    size = parse_size(args.size)
    if args.cc:  # (read by the raw sockets and by both Hubs: spawned children inherit it)
        os.environ[CONGESTION_ENV] = args.cc
    if args.net == "loopback":
        res = _pair(size, args.runs, None)
    else:
        why = unavailable()
        if why is not None:
            print(f"--net netns: {why}", file=sys.stderr)
            raise SystemExit(2)
        with Fabric(2, args.rate) as fabric:
            res = _pair(size, args.runs, fabric)
    verified = res.pop("digests") == res.pop("published_digests")
    _report(args, res, verified)
    if not verified:
        raise SystemExit("the fetched tensors differ from the published ones")


def _pair(size: int, runs: int, fabric: Fabric | None) -> dict[str, Any]:
    """Start the publisher (in node 0 of ``fabric``, or on loopback) and run the fetcher
    against it (in node 1, or in this process)."""
    if fabric is None:
        addr, pub_ns = local_addresses(["publisher"])["publisher"], None
    else:
        addr, pub_ns = f"{fabric.ip(0)}:{PORT}", fabric.ns(0)
    ctx = mp.get_context("spawn")
    cmds, replies = ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hub-p2p-") as data_dir:
        pub = ctx.Process(
            target=publisher_main, args=(size, addr, pub_ns, data_dir, cmds, replies), daemon=True
        )
        pub.start()
        fetcher = None
        try:
            _, raw_port, digests = replies.get(timeout=300)
            if fabric is None:
                res = run(_fetcher(addr, raw_port, runs, cmds, replies))
            else:
                out = ctx.Queue()
                fetcher = ctx.Process(
                    target=fetcher_main,
                    args=(
                        fabric.ns(1), f"{fabric.ip(1)}:{PORT}", addr, raw_port, runs, cmds,
                        replies, out,
                    ),
                    daemon=True,
                )  # fmt: skip
                fetcher.start()
                res = _result(out, fetcher, 300 + 120 * runs)
        finally:
            cmds.put(("stop", 0))
            for p in (fetcher, pub):
                if p is not None:
                    p.join(30)
                    if p.is_alive():
                        p.kill()
    res["published_digests"] = digests
    return res


def _result(out: Any, proc: Any, timeout: float) -> dict[str, Any]:
    """What ``proc`` puts on ``out``; a clear error at once if it exits without it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got: dict[str, Any] = out.get(timeout=1.0)
            return got
        except queue.Empty:
            if not proc.is_alive():
                raise SystemExit(f"the fetcher exited ({proc.exitcode}) with no result") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"the fetcher gave no result in {timeout:.0f} s") from None


async def _fetcher(
    addr: str, raw_port: int, runs: int, cmds: Any, replies: Any, listen: str = "127.0.0.1:0"
) -> dict[str, Any]:
    """The rollout's side: publish (remotely) then fetch, alternating with the raw copy."""
    hub = await Hub.start("fetcher", listen=listen, seeds=[addr], secret=SECRET)
    loop = asyncio.get_running_loop()
    host = addr.rpartition(":")[0]

    async def publish(version: int) -> float:
        cmds.put(("publish", version))
        tag, seconds = await loop.run_in_executor(None, replies.get, True, 300)
        assert tag == "published", tag
        return float(seconds)

    try:
        first_publish = await publish(1)
        manifest = await hub.manifest(MODEL, 1)
        into = empty_like_manifest(manifest)
        views = [byte_view(t) for t in into.values()]
        pub_s: list[float] = []
        fetch_s: list[float] = []
        raw_s: list[float] = []
        version = 1
        for i in range(runs + 1):
            if i % 2:  # alternate which goes first, so neither always follows the other
                raw = await loop.run_in_executor(None, raw_receive, raw_port, views, host)
            p = first_publish if version == 1 else await publish(version)
            t0 = time.perf_counter()
            await hub.fetch(MODEL, version, into)
            f = time.perf_counter() - t0
            await hub.unpublish(MODEL, version, keep_copy=False)  # its buffers are reused
            if not i % 2:
                raw = await loop.run_in_executor(None, raw_receive, raw_port, views, host)
            if i:  # the first pair is the warm-up
                pub_s.append(p)
                fetch_s.append(f)
                raw_s.append(raw)
            version += 1
        last = await publish(version)  # the raw path wrote last: fetch again, then compare
        await hub.fetch(MODEL, version, into)
        return {
            "publish_s": pub_s,
            "fetch_s": fetch_s,
            "baseline_s": raw_s,
            "last_publish_s": last,
            "bytes": manifest.total_bytes,
            "chunks": manifest.num_chunks,
            "tensors": len(manifest.tensors),
            "digests": tensor_digests(into),
        }
    finally:
        await hub.close()


def runs(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def _where(args: argparse.Namespace) -> str:
    if args.net == "loopback":
        return "loopback"
    return f"NIC-limited {args.rate:g} Mbit/s (netns){f', TCP {args.cc}' if args.cc else ''}"


def _report(args: argparse.Namespace, res: dict[str, Any], verified: bool) -> None:
    n = res["bytes"]
    pub, fetch, raw = res["publish_s"], res["fetch_s"], res["baseline_s"]
    whole = [p + f for p, f in zip(pub, fetch, strict=True)]
    # Each pair ran back to back, so its ratio cancels slow drifts of the shared machine.
    ratio = median([b / t for t, b in zip(whole, raw, strict=True)])
    ratio_fetch = median([b / t for t, b in zip(fetch, raw, strict=True)])
    print_table(
        f"Hub.publish + Hub.fetch point to point, {_where(args)}: {n / 2**20:.0f} MiB, "
        f"{res['tensors']} tensors, {res['chunks']} chunks, {args.runs} pairs",
        ["path", "GB/s (median)", "runs (s)"],
        [
            ["baseline: blocking sendall → recv_into", n / median(raw) / 1e9, runs(raw)],
            ["Hub.publish (digests, Raft commit)", n / median(pub) / 1e9, runs(pub)],
            ["Hub.fetch (manifest, holders, verified)", n / median(fetch) / 1e9, runs(fetch)],
            ["publish + fetch", n / median(whole) / 1e9, runs(whole)],
            ["ratio raw / (publish + fetch), median of pairs", ratio, ""],
            ["ratio raw / fetch, median of pairs", ratio_fetch, ""],
        ],
    )
    print(f"fetched tensors {'match' if verified else 'DIFFER FROM'} the published ones")
    write_json(
        args.json,
        {
            "bench": "hub_p2p",
            "bytes": n,
            "ratio": ratio,
            "ratio_fetch_only": ratio_fetch,
            "publish_seconds": pub,
            "fetch_seconds": fetch,
            "baseline_seconds": raw,
            "chunks": res["chunks"],
            "verified": verified,
            "net": args.net,
            "rate_mbit": args.rate if args.net == "netns" else None,
            "congestion_control": args.cc,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
