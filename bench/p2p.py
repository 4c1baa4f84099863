"""Point-to-point: tensorhub's transport against a plain blocking socket, same bytes, same run.

A server process holds a state_dict of real torch tensors (``--size`` bytes in all). The
client process fetches it with tensorhub (manifest, a window of chunk requests, every chunk
received straight into preallocated destination tensors and verified against its BLAKE3
digest), and,
interleaved run by run, receives the same tensor bytes over a blocking socket
(``sendall`` of 1 MiB slices → ``recv_into`` the destination tensors), the baseline. The
figure of merit is the ratio of medians; both are measured on the same machine minutes
apart, so the noise of a shared 2-core VM cancels out as far as it can.

``--transport ucx`` moves tensorhub's frames over UCX (ucxx) instead; the baseline stays the
raw socket, so the ratio says what UCX buys (or costs) on this host. Where ``UCX_TLS`` is
unset and the host has no RDMA device, UCX is pointed at loopback TCP.

``--device cuda`` publishes from GPU tensors and fetches into GPU tensors: tensorhub copies
each verified chunk to the device while the next ones arrive; the baseline receives into
pinned host memory over the raw socket, then copies it all to the device (its copy time is
reported apart, so the table also shows how much of the copy tensorhub hid).

    python bench/p2p.py --size 1GiB --json out.json
    python bench/p2p.py --transport ucx --size 256MiB --json out.json
    python bench/p2p.py --device cuda --size 4GiB --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


import torch

from bench.common import machine, median, parse_size, print_table, write_json
from tensorhub.core.layout import DEFAULT_CHUNK_SIZE
from tensorhub.dataplane.node import Node
from tensorhub.dataplane.view import Routes
from tensorhub.io import ucx
from tensorhub.io.loop import loop_name, run
from tensorhub.io.tcp import use_congestion_control
from tensorhub.io.tensors import byte_view, empty_like_manifest
from tensorhub.testing.weights import llm_like_state_dict

SECRET = b"bench-secret"
SLICE = 1 << 20


def _raw_sender(sock: socket.socket, views: list[memoryview]) -> None:
    while True:
        conn, _ = sock.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            use_congestion_control(conn)  # (--cc: the same algorithm as the nodes')
            for v in views:
                for off in range(0, len(v), SLICE):
                    conn.sendall(v[off : off + SLICE])
            conn.recv(1)


def server_main(size: int, chunk_size: int, transport: str, device: str, q: Any, stop: Any) -> None:
    sd = llm_like_state_dict(size)
    views = [byte_view(t) for t in sd.values()]
    published = {k: t.to(device) for k, t in sd.items()}  # a trainer's GPU weights
    raw = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_raw_sender, args=(raw, views), daemon=True).start()

    async def main() -> None:
        node = await Node.start("bench-server", secret=SECRET, transport=transport)
        manifest = node.serve("bench", 1, published, chunk_size=chunk_size)
        q.put((node.address, node.ucx_address, raw.getsockname()[1], manifest.root, loop_name()))
        await asyncio.get_running_loop().run_in_executor(None, stop.wait)
        await node.close()

    run(main())


def raw_receive(port: int, views: list[memoryview], host: str = "127.0.0.1") -> float:
    t0 = time.perf_counter()
    with socket.create_connection((host, port)) as s:
        use_congestion_control(s)
        for v in views:
            off = 0
            while off < len(v):
                n = s.recv_into(v[off : off + SLICE])
                if n == 0:
                    raise ConnectionError("raw sender closed early")
                off += n
        s.sendall(b"k")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="1GiB", help="bytes of tensors to move (e.g. 1GiB, 256MiB)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs of each (after 1 warm-up)")
    ap.add_argument("--chunk-size", default=str(DEFAULT_CHUNK_SIZE))
    ap.add_argument("--window", type=int, default=8, help="chunk requests in flight")
    ap.add_argument("--transport", default="tcp", choices=["tcp", "ucx"])
    ap.add_argument("--device", default="cpu", help="where the tensors live: cpu or cuda")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    size, chunk_size = parse_size(args.size), parse_size(args.chunk_size)
    on_gpu = args.device != "cpu"
    if args.transport == "ucx":
        ucx.loopback_defaults()

    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    srv = ctx.Process(
        target=server_main,
        args=(size, chunk_size, args.transport, args.device, q, stop),
        daemon=True,
    )
    srv.start()
    addr, ucx_addr, raw_port, root, server_loop = q.get(timeout=300)

    async def client() -> dict[str, Any]:
        routes = Routes({addr: ucx_addr} if ucx_addr else {})
        node = await Node.start(
            "bench-client", secret=SECRET, transport=args.transport, view=routes
        )
        peer = await node.peer(addr)
        manifest = await peer.get_manifest("bench", 1, root)
        into = empty_like_manifest(manifest, args.device)
        host = {k: torch.empty_like(t, device="cpu", pin_memory=on_gpu) for k, t in into.items()}
        views = [byte_view(t) for t in (host if on_gpu else into).values()]

        def baseline() -> tuple[float, float]:
            """Raw socket into host memory, then (on a GPU) one copy to the device."""
            t_net = raw_receive(raw_port, views)
            if not on_gpu:
                return t_net, 0.0
            t0 = time.perf_counter()
            for k, t in into.items():
                t.copy_(host[k], non_blocking=True)
            torch.cuda.synchronize()
            return t_net, time.perf_counter() - t0

        th: list[float] = []
        raw: list[float] = []
        h2d: list[float] = []
        for i in range(args.runs + 1):
            # Alternate which path goes first, so neither always follows the other.
            if i % 2:
                t_net, t_copy = baseline()
            r = await node.fetch(
                addr, "bench", 1, into, expected_root=root, window=args.window, hold=False
            )
            if not i % 2:
                t_net, t_copy = baseline()
            if not i:
                first = r.seconds  # on a GPU, this fetch also pins its host mirror
            else:  # the first pair is the warm-up
                th.append(r.seconds)
                raw.append(t_net + t_copy)
                h2d.append(t_copy)
        # Bit-identity: the raw path wrote the same bytes last; re-fetch and compare digests.
        await node.fetch(addr, "bench", 1, into, expected_root=root, hold=False)
        await node.close()
        return {
            "tensorhub_s": th,
            "baseline_s": raw,
            "h2d_s": h2d,
            "first_s": first,
            "client_loop": loop_name(),
            "bytes": manifest.total_bytes,
            "chunks": manifest.num_chunks,
            "tensors": len(manifest.tensors),
            "connection": type(peer.conn).__name__,
        }

    try:
        res = run(client())
    finally:
        stop.set()
        srv.join(10)
    n = res["bytes"]
    th_gbps = n / median(res["tensorhub_s"]) / 1e9
    raw_gbps = n / median(res["baseline_s"]) / 1e9
    # Each pair ran back to back, so a pair's ratio cancels slow drifts of the shared
    # machine; the median over pairs is the figure of merit.
    ratio = median([b / t for t, b in zip(res["tensorhub_s"], res["baseline_s"], strict=True)])
    print_table(
        f"p2p over {args.transport} ({res['connection']}), {args.device} tensors: "
        f"{n / 2**20:.0f} MiB, "
        f"{res['tensors']} tensors, {res['chunks']} chunks of "
        f"{chunk_size >> 10} KiB, window {args.window}, {args.runs} runs (median)",
        ["path", "GB/s", "runs (s)"],
        [
            [
                "baseline: blocking sendall → recv_into" + (" → copy to device" if on_gpu else ""),
                raw_gbps,
                " ".join(f"{t:.3f}" for t in res["baseline_s"]),
            ],
            *(
                [["  of which the copy to the device", n / median(res["h2d_s"]) / 1e9, ""]]
                if on_gpu
                else []
            ),
            [
                "tensorhub: framed chunks, verified",
                th_gbps,
                " ".join(f"{t:.3f}" for t in res["tensorhub_s"]),
            ],
            ["ratio tensorhub / baseline (median of pairs)", ratio, ""],
            ["tensorhub's first fetch (warm-up, untimed above)", n / res["first_s"] / 1e9, ""],
            ["ratio of medians", th_gbps / raw_gbps, ""],
        ],
    )
    write_json(
        args.json,
        {
            "bench": "p2p",
            "transport": args.transport,
            "device": args.device,
            "connection": res["connection"],
            "ucx_env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")},
            "bytes": n,
            "tensorhub_gbps": th_gbps,
            "baseline_gbps": raw_gbps,
            "ratio": ratio,
            "ratio_of_medians": th_gbps / raw_gbps,
            "tensorhub_seconds": res["tensorhub_s"],
            "baseline_seconds": res["baseline_s"],
            "baseline_device_copy_seconds": res["h2d_s"],
            "tensorhub_first_fetch_seconds": res["first_s"],
            "chunk_size": chunk_size,
            "window": args.window,
            "chunks": res["chunks"],
            "loops": {"server": server_loop, "client": res["client_loop"]},
            "verified": True,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()
