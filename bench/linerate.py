"""Fan-out on NIC-limited nodes: one publisher → N receivers, each node in its own network
namespace behind a NIC of a chosen rate (tensorhub/testing/netns.py).

Systems, in the same run on the same fabric:
- ``p2p``: one raw-socket copy publisher → one receiver: the denominator, "one copy";
- ``star``: every receiver pulls the whole model from the publisher at once;
- ``chain``: a raw pipelined relay publisher → r1 → r2 → … (what a ring broadcast does,
  in ~40 lines: each receiver forwards each piece as it arrives), through one reused
  1 MiB buffer: the bytes are forwarded, not kept (#17's baseline);
- ``chain-landed``: the same relay, each receiver landing the model in a buffer of its
  own (allocated and touched before the CPU window, as tensorhub's destinations are) and
  forwarding from there, the publisher sending from one: what a broadcast that delivers
  weights (NCCL's ring writes its output buffer) pays for memory beyond the chain;
- ``tensorhub``: the real stack (Hub processes: Raft voters, gossip, the swarm), the
  publisher publishes and every receiver fetches at once.

Reported, each a ratio measured in this run: the last receiver's time / one copy's; the
publisher's egress in model sizes; bytes received beyond one model per receiver
(duplicates), as a fraction of what the receivers needed; the machine's CPU seconds per GB
received during the transfer, and how busy its cores were (is this host out of CPU before
the NICs are full?); beside each tensorhub row, what
the simulator predicts for the same case (``sim/fanout.py``, seeds 1-3: the same cores
over a modelled network; in brackets how far off it is, which #18 wants within 10 %), and
after the table, how much of line rate the publisher's and
the receivers' NICs carried in each tenth of the transfer (where the time went). Needs root
(namespaces); says why and exits 2 where it cannot build them.

``--net loopback`` puts every node on this host's loopback instead (no root, no NIC): the
run then measures CPU, and ``CPU / chain`` is #17's loopback target (tensorhub's CPU seconds
per GB received over the raw chain's, same run); no simulator prediction or line-rate
profile is made there.

``--presets node,simulated`` runs tensorhub once per data-plane preset in the same run;
``--cc cubic`` runs every system's connections under one TCP congestion control (the
host's otherwise). The JSON records when each receiver began and finished (``starts``,
``ends``).

    python bench/linerate.py --receivers 4 --size 256MiB --rate 1000 --json out/linerate.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import mmap
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, parse_size, print_table, write_json
from bench.cpu_load import CpuLoad
from sim.fanout import predict_each
from tensorhub.core.swarm.presets import preset
from tensorhub.dataplane.trace import TRACE_ENV, file_safe
from tensorhub.io.tcp import CONGESTION_ENV, use_congestion_control
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.loopback import Loopback
from tensorhub.testing.netns import QUEUE_MS, Fabric, enter, unavailable

PORT = 7100
PIECE = 1 << 20
MODEL = "linerate"

Nodes = Fabric | Loopback
"""Where the nodes live: namespaces behind NICs (``--net netns``), or loopback (``--net
loopback``: no NIC, so the run measures CPU)."""


def _tuned(sock: socket.socket) -> socket.socket:
    """A raw system's connection with ``--cc``'s congestion control, as tensorhub's."""
    use_congestion_control(sock)
    return sock


def _host_congestion_control() -> str:
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return "?"


def _touched(size: int) -> memoryview:
    """A buffer of ``size`` bytes with every page faulted in (its allocation is not the
    transfer's cost, as tensorhub's destination tensors are made before its CPU window)."""
    buf = bytearray(size)
    buf[:: mmap.PAGESIZE] = b"\1" * len(range(0, size, mmap.PAGESIZE))
    return memoryview(buf)


def _send_all(conn: socket.socket, data: memoryview, size: int) -> None:
    """Send ``size`` bytes: ``data`` over and over (one reused piece), or once (a model)."""
    left = size
    while left:
        at = (size - left) % len(data)
        n = min(left, PIECE, len(data) - at)
        conn.sendall(data[at : at + n])
        left -= n
    conn.shutdown(socket.SHUT_WR)


def _source(
    ns: str | None, ip: str, receivers: int, size: int, land: bool, pipe: mpc.Connection
) -> None:
    """Serve ``size`` bytes to each of ``receivers`` connections at once, on "go"; with
    ``land``, from a model-sized buffer (else from one reused piece)."""
    enter(ns)
    data = _touched(size) if land else memoryview(bytes(PIECE))
    ls = socket.create_server((ip, PORT), backlog=64)
    pipe.send(("ready",))
    pipe.recv()  # go
    conns = [_tuned(ls.accept()[0]) for _ in range(receivers)]
    t0 = time.time()
    threads = [threading.Thread(target=_send_all, args=(c, data, size)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pipe.send(("start", t0))


def _receiver(
    ns: str | None,
    ip: str,
    upstream: str,
    forward: bool,
    size: int,
    land: bool,
    pipe: mpc.Connection,
) -> None:
    """Read ``size`` bytes from ``upstream``; with ``forward``, pass each piece on to the
    one receiver that connects to us (a pipelined chain). With ``land``, into a buffer of
    ``size`` bytes (the model, kept), else into one reused piece."""
    enter(ns)
    ls = socket.create_server((ip, PORT), backlog=4) if forward else None
    dest = _touched(size) if land else memoryview(bytearray(PIECE))
    pipe.send(("ready",))
    pipe.recv()  # connect now (upstream listens)
    up = _tuned(socket.create_connection((upstream, PORT)))
    down = _tuned(ls.accept()[0]) if ls is not None else None
    pipe.send(("connected",))
    got = 0
    while got < size:
        view = dest[got : got + PIECE] if land else dest
        n = up.recv_into(view)
        if n == 0:
            break
        if down is not None:
            try:
                down.sendall(view[:n])
            except OSError:  # our downstream died: keep receiving for ourselves
                down = None
        got += n
    t1 = time.time()
    if down is not None:
        down.shutdown(socket.SHUT_WR)
    pipe.send(("end", t1, got))


def _cpu_now() -> tuple[float, float]:
    """(wall clock, :func:`_cpu_seconds`): a transfer's CPU window starts and ends here."""
    return time.monotonic(), _cpu_seconds()


def _cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process, the
    kernel's share of moving packets through veths and qdiscs included): the cost of a
    transfer is the difference around it. Machine-wide, since the kernel's work for a
    process's sockets is not all charged to that process."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_use(start: tuple[float, float], nbytes: int) -> dict[str, float]:
    """The machine's CPU from ``start`` (:func:`_cpu_now`) to now, for ``nbytes``
    delivered: seconds per GB, and the busy fraction of all cores over that window."""
    (w0, c0), (w1, c1) = start, _cpu_now()
    return {
        "cpu_seconds": c1 - c0,
        "cpu_seconds_per_gb": (c1 - c0) / (nbytes / 1e9),
        "cpu_busy_fraction": (c1 - c0) / ((w1 - w0) * (os.cpu_count() or 1)),
    }


@dataclass(frozen=True)
class Case:
    """Where a chain breaks (#17): ``victim`` (a receiver's index, mid-chain) is
    ``killed`` ``kill_after`` seconds into the transfer, ``slow`` (half the NIC rate), or
    ``late`` (it begins ``kill_after`` seconds after the others); or, with no victim (0),
    the publisher ``stops`` serving once one receiver holds the whole model. Reported:
    the last *healthy* receiver against one copy, and the victim's time against its own
    bound (a slow one: two copies; a late one: one copy from its own start)."""

    kind: str
    victim: int
    kill_after: float = 0.0

    @property
    def bound(self) -> float:
        """The victim's own bound, in copies."""
        return 2.0 if self.kind == "slow" else 1.0


def _raw(
    fabric: Nodes,
    receivers: list[int],
    chain: bool,
    size: int,
    case: Case | None = None,
    land: bool = False,
) -> dict[str, Any]:
    """One raw-socket run: the star (or a single copy) when not ``chain``; with ``case``,
    its victim is killed or slow as the case says, or late: a static group (a chain, a
    star, NCCL's communicator) begins once its last member is there. With ``land``, every
    node keeps the model in memory of its own (``chain-landed``)."""
    ctx = mp.get_context("spawn")
    pipes: list[mpc.Connection] = []
    procs = []
    ours, theirs = ctx.Pipe()
    src = ctx.Process(
        target=_source,
        args=(fabric.ns(0), fabric.ip(0), 1 if chain else len(receivers), size, land, theirs),
        daemon=True,
    )
    src.start()
    assert ours.recv() == ("ready",)
    for k, i in enumerate(receivers):
        upstream = fabric.ip(receivers[k - 1]) if chain and k else fabric.ip(0)
        forward = chain and k < len(receivers) - 1
        mine, theirs = ctx.Pipe()
        p = ctx.Process(
            target=_receiver,
            args=(fabric.ns(i), fabric.ip(i), upstream, forward, size, land, theirs),
            daemon=True,
        )
        p.start()
        assert mine.recv() == ("ready",)
        pipes.append(mine)
        procs.append(p)
    # Connect from the tail of a chain back to its head, so each listener's one
    # downstream is there before its upstream sends; a star's receivers in any order.
    for pipe in reversed(pipes) if chain else pipes:
        pipe.send("connect")
    start = _cpu_now()
    began = time.time()
    if case is not None and case.kind == "late":
        time.sleep(case.kill_after)  # (everyone waits for the late one)
    ours.send("go")
    for pipe in pipes:
        assert pipe.recv() == ("connected",)
    if case is not None and case.kind == "killed":
        time.sleep(case.kill_after)
        procs[receivers.index(case.victim)].kill()
    ends: dict[int, tuple[float, int]] = {}
    for i, pipe in zip(receivers, pipes, strict=True):
        with contextlib.suppress(EOFError):  # (the victim's pipe: it was killed)
            _, t1, got = pipe.recv()
            ends[i] = (t1, got)
    cpu = _cpu_use(start, size * len(receivers))
    t0 = ours.recv()[1]
    if case is not None and case.kind == "late":
        t0 = began  # (the others' time counts from when they were ready)
    for p in [src, *procs]:
        p.join(30)
    egress = 1.0 if chain else float(len(receivers))
    return _outcome(receivers, ends, t0, size, case, egress, cpu)


def _outcome(
    receivers: list[int],
    ends: dict[int, tuple[float, int]],
    t0: float,
    size: int,
    case: Case | None,
    egress: float,
    cpu: dict[str, float],
) -> dict[str, Any]:
    """A baseline's result from when each receiver ended and how many bytes it got
    (``ends``; a killed one may be missing), counted from ``t0``: the last healthy
    receiver's time, or None where a healthy one was left short (an error in a healthy
    run), and the victim's time (a late one's from its own start)."""
    healthy = [i for i in receivers if case is None or i != case.victim]
    short = [i for i in healthy if ends.get(i, (0.0, 0))[1] != size]
    if short and case is None:
        got = ends.get(short[0], (0.0, 0))[1]
        raise RuntimeError(f"receiver {short[0]} got {got} of {size} bytes")
    out: dict[str, Any] = {
        "seconds": max(ends[i][0] for i in healthy) - t0 if not short else None,
        "healthy_short": len(short),  # healthy receivers left without the whole model
        "publisher_egress_models": egress,
        **cpu,
    }
    if case is not None and case.kind != "killed" and case.victim in ends:
        late = case.kill_after if case.kind == "late" else 0.0
        out["victim_seconds"] = ends[case.victim][0] - t0 - late
    return out


JOIN_TIMEOUT = 300
"""Seconds a gloo rank may take to start, import torch and join its group."""


def _gloo_rank(
    ns: str | None,
    store: str,
    rank: int,
    world: int,
    size: int,
    timeout_s: float,
    pipe: mpc.Connection,
) -> None:
    """One member of ``gloo``: rank 0 the publisher, rank k receiver k. Joins the group
    through ``store``, a file every rank of this host reads (so nothing listens but gloo's
    own sockets, at the rank's NIC), every pair connected; makes and touches the model
    (``size`` bytes, one flat tensor: one collective, the best case for gloo), then on
    "go" broadcasts it from rank 0 and reports when it had it."""
    enter(ns)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0" if ns is not None else "lo"
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",  # (a file: no port of the host's is listened on)
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    model = torch.full((size,), 1 if rank == 0 else 0, dtype=torch.uint8)
    dist.barrier()
    pipe.send(("ready",))
    pipe.recv()  # go
    t0 = time.time()
    try:
        dist.broadcast(model, src=0)
        raised = False
    except RuntimeError:  # a member died mid-broadcast: the collective failed here
        raised = True
    t1 = time.time()
    # A rank whose own copy had landed before a send of its failed holds the model (its
    # call returned, raising, at t1).
    whole = rank == 0 or (bool(model[:: 1 << 16].eq(1).all()) and int(model[-1]) == 1)
    pipe.send(("end", t0, t1, size if whole else 0))
    if raised:
        os._exit(0)  # (tearing the group down would wait on the dead member too)
    dist.destroy_process_group()


def _gloo(
    fabric: Nodes,
    receivers: list[int],
    size: int,
    one: float,
    case: Case | None = None,
) -> dict[str, Any]:
    """``torch.distributed.broadcast`` over gloo, the collective a PyTorch job without
    NCCL moves weights with: publisher rank 0, each receiver a rank in its namespace.
    Gloo's broadcast is a binomial tree, whole buffers, not pipelined (gloo/broadcast.cc:
    in round i each rank that has the data sends it all to the rank 2^i past it, the
    root's sends all at once), so the root sends ceil(log2(N + 1)) copies and the last
    receiver waits on that many rounds. With ``case``, its victim is killed or slow, or
    the group (a static one, as the chain's) begins once a late victim is there; a rank
    that waits on a killed one gives up after gloo's timeout and counts as short. Gloo's
    sockets take no option of ours, so they run under the namespaces' default congestion
    control, whatever ``--cc`` says (recorded as ``congestion_control``)."""
    world = len(receivers) + 1
    rounds = (world - 1).bit_length()  # log2ceil(world): gloo's rounds, the root's sends
    timeout_s = 10.0 + 4.0 * rounds * one
    ctx = mp.get_context("spawn")
    pipes: dict[int, mpc.Connection] = {}
    procs: dict[int, mp.process.BaseProcess] = {}
    tmp = tempfile.TemporaryDirectory(prefix="tensorhub-linerate-gloo-")
    store = os.path.join(tmp.name, "store")
    try:
        for rank in [0, *receivers]:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=_gloo_rank,
                args=(fabric.ns(rank), store, rank, world, size, timeout_s, theirs),
                daemon=True,
            )
            p.start()
            pipes[rank], procs[rank] = mine, p
        for rank, pipe in pipes.items():  # (nine processes importing torch on two cores)
            try:
                if not pipe.poll(JOIN_TIMEOUT) or pipe.recv() != ("ready",):
                    raise RuntimeError(f"gloo rank {rank} did not join in {JOIN_TIMEOUT} s")
            except EOFError:
                raise RuntimeError(
                    f"gloo rank {rank} exited before it joined (its stderr: why)"
                ) from None
        start = _cpu_now()
        began = time.time()
        if case is not None and case.kind == "late":
            time.sleep(case.kill_after)  # (everyone waits for the late one)
        for pipe in pipes.values():
            pipe.send("go")
        if case is not None and case.kind == "killed":
            time.sleep(case.kill_after)
            procs[case.victim].kill()
        started: dict[int, float] = {}
        ends: dict[int, tuple[float, int]] = {}
        for rank, pipe in pipes.items():
            with contextlib.suppress(EOFError):  # (the victim's pipe: it was killed)
                if pipe.poll(timeout_s + 30):
                    _, started[rank], t1, got = pipe.recv()
                    ends[rank] = (t1, got)
        cpu = _cpu_use(start, size * len(receivers))
        for member in procs.values():
            member.join(10)
    finally:
        for member in procs.values():
            if member.is_alive():
                member.kill()
        tmp.cleanup()
    t0 = began if case is not None and case.kind == "late" else started.get(0, began)
    # (egress: gloo's algorithm's; tests/test_linerate_gloo.py reads it off the NIC)
    out = _outcome(receivers, ends, t0, size, case, float(rounds), cpu)
    out["congestion_control"] = (
        fabric.congestion_control() if isinstance(fabric, Fabric) else _host_congestion_control()
    )
    return out


class _Sampler(threading.Thread):
    """Every node's NIC byte counters, every ``every`` seconds, until stopped: where in the
    run the links sat idle."""

    def __init__(self, fabric: Fabric, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.fabric, self.every = fabric, every
        self.samples: list[tuple[float, list[tuple[int, int]]]] = []
        self._stop_at = threading.Event()

    def run(self) -> None:
        while not self._stop_at.is_set():
            self.samples.append((time.monotonic(), self.fabric.counters()))
            self._stop_at.wait(self.every)

    def stop(self) -> list[tuple[float, list[tuple[int, int]]]]:
        self._stop_at.set()
        if self.ident is not None:  # (never started: the run failed before its transfer)
            self.join()
        self.samples.append((time.monotonic(), self.fabric.counters()))
        return self.samples


def _phases(
    samples: list[tuple[float, list[tuple[int, int]]]], rate_mbit: float, parts: int = 10
) -> list[dict[str, float]]:
    """The transfer (first to last byte into a receiver) cut into ``parts`` equal spans:
    in each, the publisher's egress and the receivers' ingress as fractions of line
    rate (mean over receivers, and least over those still fetching)."""
    line = rate_mbit * 1e6 / 8
    rx = [sum(c[1] for c in cs[1:]) for _, cs in samples]
    moving = [i for i in range(1, len(samples)) if rx[i] > rx[i - 1] + 64 * 1024]
    if not moving:
        return []
    t0, t1 = samples[moving[0] - 1][0], samples[moving[-1]][0]
    final = [0.995 * c[1] + 0.005 * samples[0][1][i][1] for i, c in enumerate(samples[-1][1])]
    out = []
    for k in range(parts):
        a, b = t0 + (t1 - t0) * k / parts, t0 + (t1 - t0) * (k + 1) / parts

        def at(t: float, node: int, way: int) -> float:
            """Counter interpolated at time t."""
            for (ta, ca), (tb, cb) in itertools.pairwise(samples):
                if ta <= t <= tb:
                    f = (t - ta) / (tb - ta) if tb > ta else 0.0
                    return ca[node][way] + f * (cb[node][way] - ca[node][way])
            return float(samples[-1][1][node][way])

        span = (b - a) * line
        nodes = range(1, len(samples[0][1]))
        ingress = [(at(b, i, 1) - at(a, i, 1)) / span for i in nodes]
        # The least over receivers still fetching (one that finished takes nothing in).
        fetching = [x for i, x in zip(nodes, ingress, strict=True) if at(a, i, 1) < final[i]]
        out.append(
            {
                "publisher_egress": (at(b, 0, 0) - at(a, 0, 0)) / span,
                "ingress_mean": sum(ingress) / len(ingress),
                "ingress_min": min(fetching, default=0.0),
            }
        )
    return out


def _tensorhub(
    fabric: Nodes,
    receivers: int,
    size: int,
    preset: str,
    chunk: int,
    case: Case | None = None,
    steps: int = 1,
) -> dict[str, Any]:
    """The real stack: Hub processes, one per namespace, with the data-plane ``preset``;
    the publisher and two receivers are the Raft voters. Everyone is in one rack (a flat
    fabric). With ``case``, its victim is killed mid-transfer or is slow. ``steps``: that
    many versions in turn, as an RL job's steps: the publisher publishes each, every
    receiver fetches it, then drops the one before (an engine's weights are overwritten in
    place) as the publisher does; what the last step took is the result, each step's time
    under ``step_seconds``. A victim is killed, or begins late, in the last step alone."""
    specs = [
        Spec(
            "publisher",
            "dc0/rack0/publisher",
            voter=True,
            netns=fabric.ns(0),
            listen=f"{fabric.ip(0)}:{PORT}",
            dataplane=preset,
        )
    ]
    for i in range(1, receivers + 1):
        specs.append(
            Spec(
                f"r{i}",
                f"dc0/rack0/r{i}",
                voter=i <= 2,
                netns=fabric.ns(i),
                listen=f"{fabric.ip(i)}:{PORT}",
                dataplane=preset,
            )
        )
    names = [s.name for s in specs[1:]]
    victim = f"r{case.victim}" if case is not None else None
    healthy = [n for n in names if n != victim]
    step_seconds: list[float] = []
    lag_memory: list[list[str]] = []  # after each step before the measured one
    with (
        tempfile.TemporaryDirectory(prefix="tensorhub-linerate-") as tmp,
        HubProcs(specs, tmp) as c,
    ):
        stops = case is not None and case.kind == "stops"

        def publish(version: int, seed: int) -> None:
            c.call(["publisher"], "publish", MODEL, version, size, seed, chunk)
            if version > 1:  # (the step before is overwritten: its memory is reused)
                c.call(names, "drop", MODEL, version - 1)
                if not stops:  # (it stopped serving it already)
                    c.call(["publisher"], "drop", MODEL, version - 1)

        members = [s.name for s in specs]

        def settled() -> None:
            c.wait_members(members)

        for version in range(1, steps):  # (the steps before the measured one)
            publish(version, 3 + version)
            stop = partial(_stop_after_first_copy, c, names, version) if stops else None
            # Each step's fetches begin once every node's gossip holds every other alive,
            # as the measured step's do (prepared, below). Until session 49 the first step
            # of a run began on fresh processes without that wait: the 3 traced first plans
            # (of 768) whose view of the datacenter lacked a live member were all in such a
            # step. Each link relayed past the member beside another link, judged itself
            # lagging, and the lag memory kept it behind the slow link in the measured step
            # (2.2-2.5x one copy).
            ends, _ = c.fetch_each(names, MODEL, version, None, stop, settled)
            step_seconds.append(_last_healthy(ends, healthy))
            lag_memory.append(c.wait_lag_memory(names, MODEL))
        version = steps
        publish(version, 3)

        def started() -> None:
            if stops:
                _stop_after_first_copy(c, names, version)
            if case is not None and case.kind in ("killed", "late"):
                assert victim is not None
                time.sleep(case.kill_after)
                if case.kind == "killed":
                    c.kill(victim)
                else:
                    c.call([victim], "fetch", MODEL, version, None)

        sampler = _Sampler(fabric) if isinstance(fabric, Fabric) else None  # (no NICs)
        start = _cpu_now()
        settle = 0.0

        def prepared() -> None:
            # The CPU window and the NIC samples begin once every receiver has allocated
            # and touched its destination tensors (zeroing 8 models is not the transfer's
            # cost, and it was counted until session 8: ~0.3 s of the ~4 s per GB).
            nonlocal start, settle
            # ... and every node's gossip holds every other alive (HubProcs.wait_members)
            settle = c.wait_members(members)
            if sampler is not None:
                sampler.start()
            start = _cpu_now()

        try:
            hold = (
                [victim] if victim is not None and case is not None and case.kind == "late" else []
            )
            ends, delta = c.fetch_each(names, MODEL, version, None, started, prepared, hold)
        finally:
            cpu = _cpu_use(start, size * receivers)
            samples = sampler.stop() if sampler is not None else []
    t0, seconds = min(e[0] for e in ends.values()), _last_healthy(ends, healthy)
    received = sum(b for k, b in delta.items() if k.split(">")[1] in healthy)
    pub = sum(b for k, b in delta.items() if k.startswith("publisher>"))
    out: dict[str, Any] = {
        "seconds": seconds,
        "step_seconds": [*step_seconds, seconds],
        # whose relay fell behind in each step before the measured one, as every node's
        # gossip held it before the next began (its chain's order: HolderView.lagged)
        "lag_memory": lag_memory,
        "healthy_short": 0,
        "publisher_egress_models": pub / size,
        "duplicate_fraction": max(0.0, received / (size * len(healthy)) - 1.0),
        "failures": [e[2] for e in ends.values()],
        "phases": _phases(samples, fabric.rate_mbit) if isinstance(fabric, Fabric) else [],
        # who sent whom how much (model sizes): a chain shows as one link per receiver
        "links": {k: round(b / size, 3) for k, b in sorted(delta.items())},
        # when each receiver began its fetch, seconds after the first (the simulator's
        # prediction starts each where it began here: see _predicted)
        "starts": {n: round(ends[n][0] - t0, 6) for n in sorted(ends)},
        # when each receiver finished, seconds after the first began (does the last trail
        # the first by the chain's depth, or is every link slow?)
        "ends": {n: round(ends[n][1] - t0, 6) for n in sorted(ends)},
        # seconds from the destination tensors' allocation until every node's gossip
        # held every other alive (the fetches began then)
        "membership_wait_s": round(settle, 3),
        **cpu,
    }
    if victim is not None and victim in ends:  # (from its own start: late or not)
        out["victim_seconds"] = ends[victim][1] - ends[victim][0]
    return out


def _last_healthy(ends: dict[str, list[Any]], healthy: list[str]) -> float:
    """Seconds from the first receiver's start to the last healthy receiver's end (each
    of ``ends``: the fetch's start, end, ...)."""
    return float(max(ends[n][1] for n in healthy) - min(e[0] for e in ends.values()))


def _stop_after_first_copy(c: HubProcs, names: list[str], version: int) -> None:
    """The publisher stops serving (withdraws its copy) as soon as one receiver holds the
    whole model: a trainer that must get back to training."""
    deadline = time.monotonic() + 600
    while not any(done for (done,) in c.call(names, "complete", MODEL, version)):
        if time.monotonic() > deadline:
            raise RuntimeError("no receiver completed a copy in 600 s")
        time.sleep(0.005)
    c.call(["publisher"], "drop", MODEL, version)


def _simulated(r: dict[str, Any]) -> str:
    """The simulator's prediction of the last healthy receiver, and its error."""
    if (sim := r.get("simulated_over_one_copy")) and "simulator_error" in r:
        return f"{statistics.median(sim):.2f} ({100 * r['simulator_error']:+.0f} %)"
    return "-"


def _ratio(r: dict[str, Any]) -> str | float:
    """The last receiver over one copy; with rounds, the median [least-most]."""
    if r["last_over_one_copy"] is None:
        return f"broken: {r['healthy_short']} short"
    rounds = r.get("last_over_one_copy_rounds", [])
    if len(rounds) < 2:
        return float(r["last_over_one_copy"])
    each = [x for x in rounds if x is not None]  # (some: the median is not a broken round)
    return f"{r['last_over_one_copy']:.3f} [{min(each):.3f}-{max(each):.3f}]"


def _first_step(r: dict[str, Any]) -> str:
    """With ``--steps``: the first step's last healthy receiver over one copy (before any
    node knew anything of the others), the median [least-most] over the rounds."""
    each = [x["steps_over_one_copy"][0] for x in r.get("rounds", [r]) if "steps_over_one_copy" in x]
    if not each:
        return "-"
    if len(each) == 1:
        return f"{each[0]:.3f}"
    return f"{statistics.median(each):.3f} [{min(each):.3f}-{max(each):.3f}]"


def _victim(r: dict[str, Any]) -> str:
    """How the victim fared against its own bound (a slow one: two copies; a late one: one
    copy from its own start): measured (simulated)."""
    if "victim_over_its_bound" not in r:
        return "-"
    sim = r.get("simulated_victim_over_its_bound")
    return f"{r['victim_over_its_bound']:.2f}" + (f" ({statistics.median(sim):.2f})" if sim else "")


def _round(
    fabric: Nodes,
    args: argparse.Namespace,
    systems: list[str],
    size: int,
    victim: int,
    slow: dict[int, float],
    round_no: int = 0,
) -> dict[str, dict[str, Any]]:
    """Every system once on ``fabric``, each figure a ratio to this round's own copy,
    the simulator's prediction of this round beside each tensorhub row; tensorhub's
    presets in turn, from the ``round_no``-th."""
    n = args.receivers
    results: dict[str, dict[str, Any]] = {}
    everyone = list(range(1, n + 1))
    # (one copy to a receiver at the fabric's rate: not a slow victim's NIC)
    healthy_one = next(i for i in everyone if i not in slow)
    results["p2p"] = _raw(fabric, [healthy_one], chain=False, size=size)
    one = results["p2p"]["seconds"]
    case = None
    if args.case != "healthy":
        case = Case(args.case, victim, kill_after=one / 2)
    if "star" in systems and args.case != "stops":  # (a star cannot stop after one)
        results["star"] = _raw(fabric, everyone, chain=False, size=size, case=case)
    if "chain" in systems:
        results["chain"] = _raw(fabric, everyone, chain=True, size=size, case=case)
    if "chain-landed" in systems:
        results["chain (landed)"] = _raw(
            fabric, everyone, chain=True, size=size, case=case, land=True
        )
    if "gloo" in systems and args.case != "stops":  # (its root must send to every subtree)
        results["gloo"] = _gloo(fabric, everyone, size, one, case)
    if "tensorhub" in systems:
        names = args.presets.split(",")
        # Each round begins with another preset: in a fixed order the second preset of a
        # round ran faster, whichever it was (N=8 healthy, session 31: 1.085-1.113x
        # second and 1.104-1.135x first, then the other way round with the order turned).
        turn = round_no % len(names)
        ran = {}
        for name in names[turn:] + names[:turn]:
            chunk = parse_size(args.chunk)
            where = None
            if args.trace:  # (each Hub process inherits it; a directory per run)
                where = Path(args.trace) / f"round{round_no + 1}-{file_safe(name)}"
                os.environ[TRACE_ENV] = str(where)
            ran[name] = r = _tensorhub(fabric, n, size, name, chunk, case, args.steps)
            if isinstance(fabric, Loopback):  # (the simulator models NICs, and there are none)
                continue
            sim_trace = None if where is None else where.with_name(where.name + "-simulated")
            r.update(
                _predicted(
                    args, n, size, chunk, name, slow, case, r["starts"], args.steps, sim_trace
                )
            )
        for name in names:  # (the table's order: as given)
            results[_label(name)] = ran[name]
    for r in results.values():
        r["last_over_one_copy"] = r["seconds"] / one if r["seconds"] is not None else None
        if "step_seconds" in r:  # (each step's last healthy receiver, the last measured)
            r["steps_over_one_copy"] = [t / one for t in r["step_seconds"]]
        if "victim_seconds" in r and case is not None:  # against its own bound
            r["victim_over_its_bound"] = r["victim_seconds"] / (case.bound * one)
        if "chain" in results:  # (#17's loopback target: <= 1.15x the chain's, same run)
            r["cpu_over_chain"] = r["cpu_seconds_per_gb"] / results["chain"]["cpu_seconds_per_gb"]
        if (landed := results.get("chain (landed)")) is not None:
            r["cpu_over_landed_chain"] = r["cpu_seconds_per_gb"] / landed["cpu_seconds_per_gb"]
    if isinstance(fabric, Fabric):  # (every receiver's NIC full, a slow one at its own rate)
        every = sum(fabric.rates.get(i, fabric.rate_mbit) for i in everyone)
        for name, r in results.items():
            mbit = fabric.rate_mbit if name == "p2p" else every  # (p2p: one receiver)
            r["cpu_cores_at_line_rate"] = cpu_at_line_rate(r["cpu_seconds_per_gb"], mbit / 8e3)
    return results


def cpu_at_line_rate(cpu_seconds_per_gb: float, gb_per_second: float) -> float:
    """The cores a system would keep busy moving ``gb_per_second`` (Mbit/s / 8000) into its
    receivers (every NIC at its rate) at the CPU per GB it was measured at: above the
    machine's core count, this host cannot run it at line rate, whatever the protocol does
    (N=8 at 1 Gbit/s on 2 cores: tensorhub 2.0-2.4 cores in rounds without a lag verdict,
    its last receiver 1.04-1.26x one copy; N=3: 0.8, and 1.009x; docs/results.md, session
    42)."""
    return cpu_seconds_per_gb * gb_per_second


def _label(preset_name: str) -> str:
    """A preset's row: the node's default plain, any other named."""
    return "tensorhub" if preset_name == "node" else f"tensorhub ({preset_name})"


def _predicted(
    args: argparse.Namespace,
    n: int,
    size: int,
    chunk: int,
    name: str,
    slow: dict[int, float],
    case: Case | None,
    starts: dict[str, float],
    steps: int = 1,
    trace: Path | None = None,
) -> dict[str, list[float]]:
    """The simulator's prediction of one tensorhub round (seeds 1-3): the last healthy
    receiver over one copy, counted as measured (from the first start to the last end),
    each receiver beginning when it began in the round (they began up to 21 ms apart;
    with every receiver starting at once, a simulated relay link a fraction of a
    millisecond late had tangled the chain: docs/results.md, "A fetcher is a source once
    it began"). The killed victim, gone before its start could be read, is taken to
    begin with the last one. ``steps``: the run's ``--steps`` (its last step predicted,
    each step before it telling the next its laggards). ``trace``: where seed 1's run writes
    its timeline (``--trace``: beside the measured one, for bench/trace_report.py)."""
    copy = size / (args.rate * 1e6 / 8)  # predict_each's copy: the NIC's, not the p2p run's
    began = {int(k[1:]): t / copy for k, t in starts.items()}
    if case is not None and case.victim and case.victim not in began:
        began[case.victim] = max(began.values())
    kind = case.kind if case is not None else None
    killed = None
    if case is not None and kind == "killed":  # (killed once every fetch had begun)
        killed = {case.victim: max(began.values()) + case.kill_after / copy}
    each = [
        predict_each(n, size, args.rate, chunk, preset(name), seed, slow,
                     late=began, killed=killed, stops=kind == "stops", steps=steps,
                     trace=trace if seed == 1 else None)
        for seed in (1, 2, 3)
    ]  # fmt: skip
    healthy = [i for i in range(1, n + 1) if case is None or kind == "stops" or i != case.victim]
    out = {"simulated_over_one_copy": [max(began[i] + e[i - 1] for i in healthy) for e in each]}
    if case is not None and kind in ("slow", "late"):  # (killed: no time; stops: no victim)
        out["simulated_victim_over_its_bound"] = [e[case.victim - 1] / case.bound for e in each]
    return out


_MEDIANS = (
    "seconds",
    "last_over_one_copy",
    "publisher_egress_models",
    "duplicate_fraction",
    "cpu_seconds_per_gb",
    "cpu_busy_fraction",
    "victim_over_its_bound",
    "cpu_over_chain",
    "cpu_over_landed_chain",
    "cpu_cores_at_line_rate",
)
"""The figures a multi-round run reports as their median over the rounds (a round that
broke, None, counts as the slowest)."""


def _medians(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each system's figures as the median over ``rounds`` (every round's ratio is to its
    own one copy), each round's whole result kept under ``rounds``. Why medians: on this
    2-core host single runs of the same code spread by 15 % and more (the node preset took
    1.40-1.94x one copy in four runs in a row), so one run says little."""
    out: dict[str, dict[str, Any]] = {}
    for name, first in rounds[0].items():
        mine = [r[name] for r in rounds if name in r]
        merged = {k: v for k, v in first.items() if k not in ("phases", "links")}
        for key in _MEDIANS:
            values = [r.get(key) for r in mine]
            if all(v is None for v in values):
                continue
            merged[key] = statistics.median(float("inf") if v is None else float(v) for v in values)
        if merged.get("last_over_one_copy") == float("inf"):
            merged["last_over_one_copy"] = merged["seconds"] = None
        merged["last_over_one_copy_rounds"] = [r["last_over_one_copy"] for r in mine]
        for key in ("simulated_over_one_copy", "simulated_victim_over_its_bound"):
            if key in first:  # every round's predictions (each of its own round)
                merged[key] = [x for r in mine for x in r.get(key, [])]
        merged["rounds"] = mine
        out[name] = merged
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--receivers", type=int, default=4)
    ap.add_argument("--size", default="256MiB", help="model bytes (e.g. 256MiB, 1GiB)")
    ap.add_argument("--rate", type=float, default=1000.0, help="each NIC's rate, Mbit/s")
    ap.add_argument(
        "--net",
        choices=["netns", "loopback"],
        default="netns",
        help="netns: each node in a namespace behind a --rate NIC (root); loopback: every "
        "node on this host's loopback, no NIC, so the run measures CPU (#17's loopback "
        "target: tensorhub's CPU per GB against the chain's, the 'CPU / chain' column)",
    )
    ap.add_argument("--systems", default="p2p,star,chain,tensorhub")
    ap.add_argument(
        "--presets",
        default="node",
        help="tensorhub's data-plane presets to run, comma-separated (core/swarm/presets.py)",
    )
    ap.add_argument("--chunk", default="4MiB", help="tensorhub's chunk size")
    ap.add_argument(
        "--case",
        choices=["healthy", "slow", "killed", "late", "stops"],
        default="healthy",
        help="where chains break: a mid-chain receiver at half rate, killed halfway, "
        "or beginning its fetch half a copy late; or the publisher stops serving once "
        "one receiver holds the model",
    )
    ap.add_argument(
        "--victim",
        type=int,
        help="which receiver (1..N, in the chain's order) the case strikes; default: "
        "mid-chain (N/2 + 1), so half the receivers are downstream of it",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every system this many times on the same fabric; report medians",
    )
    ap.add_argument(
        "--cc",
        help="the TCP congestion control every system's connections use in this run (e.g. "
        "cubic, bbr; tensorhub's through TENSORHUB_TCP_CONGESTION); default: the host's",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=1,
        help="tensorhub fetches this many versions in turn, as an RL job's steps (each "
        "receiver drops the one before), and the last is measured: what a node learnt in "
        "one step (a slow NIC: its lag memory) is used in the next; the first step's ratio "
        "is reported beside it",
    )
    ap.add_argument(
        "--trace",
        help="write every tensorhub fetch's timeline here (TENSORHUB_TRACE: who sent each "
        "chunk when, changes of upstream, lag verdicts), a directory per round and preset, "
        "and beside each the simulator's for the same round (-simulated, seed 1); read "
        "them with bench/trace_report.py",
    )
    ap.add_argument(
        "--queue-ms",
        type=float,
        default=QUEUE_MS,
        help="each NIC's queue, in milliseconds of its rate (tbf's latency; "
        "tensorhub/testing/netns.py QUEUE_MS): how long bytes may wait behind others",
    )
    ap.add_argument(
        "--cpu-load",
        type=float,
        default=0.0,
        metavar="CORES",
        help="run a busy load of this many cores beside the whole run "
        "(bench/cpu_load.py): with and without it, a figure that follows the "
        "load follows this host's spare CPU, not the protocol",
    )
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.queue_ms <= 0:
        ap.error("--queue-ms wants a time > 0")
    try:
        load = CpuLoad(args.cpu_load)  # (started with the fabric, below)
    except ValueError as e:
        ap.error(f"--cpu-load: {e}")
    if args.rounds < 1:
        ap.error("--rounds wants a count >= 1")
    if args.steps < 1:
        ap.error("--steps wants a count >= 1")
    if args.victim is not None and not 1 <= args.victim <= args.receivers:
        ap.error(f"--victim wants a receiver, 1..{args.receivers}")
    loopback = args.net == "loopback"
    if loopback and args.case == "slow":
        ap.error("--case slow needs NICs of a rate (--net netns)")
    why = None if loopback else unavailable()
    if why is not None:
        print(f"bench/linerate.py: cannot run: {why}", file=sys.stderr)
        raise SystemExit(2)
    if args.cc:  # (read by this process's raw sockets and inherited by every Hub process)
        os.environ[CONGESTION_ENV] = args.cc
    cc = args.cc or _host_congestion_control()
    size, n = parse_size(args.size), args.receivers
    systems = args.systems.split(",")
    # mid-chain: half the receivers are downstream of it (none when the publisher stops)
    victim = 0 if args.case == "stops" else args.victim or n // 2 + 1
    slow = {victim: args.rate / 2} if args.case == "slow" else {}
    rounds: list[dict[str, dict[str, Any]]] = []
    nodes: Nodes = (
        Loopback() if loopback else Fabric(n + 1, args.rate, rates=slow, queue_ms=args.queue_ms)
    )
    with nodes as fabric, load:
        for k in range(args.rounds):
            if args.rounds > 1:
                print(f"round {k + 1} of {args.rounds}", flush=True)
            rounds.append(_round(fabric, args, systems, size, victim, slow, k))
    one = statistics.median(r["p2p"]["seconds"] for r in rounds)
    results = rounds[0] if len(rounds) == 1 else _medians(rounds)
    for r in results.values():
        if (sim := r.get("simulated_over_one_copy")) and r["last_over_one_copy"]:
            # #18's check of the simulator against reality: within 10 % of the measurement
            # (of the median of the rounds, with --rounds).
            r["simulator_error"] = statistics.median(sim) / r["last_over_one_copy"] - 1.0
    what = {
        "healthy": "",
        "slow": f"; r{victim} at half rate (last = last healthy receiver)",
        "killed": f"; r{victim} killed after {one / 2:.2f} s (last = last healthy receiver)",
        "late": f"; r{victim} begins {one / 2:.2f} s late (last = last healthy receiver)",
        "stops": "; the publisher stops serving once a receiver holds the model",
    }[args.case]
    if args.cpu_load:
        what += f"; beside a CPU load of {args.cpu_load:g} cores (got {load.cores_used:.2f})"
    where = "loopback (no NIC: CPU-bound)" if loopback else f"{args.rate:g} Mbit/s NICs"
    by_chain = "chain" in results
    by_landed = "chain (landed)" in results
    print_table(
        f"fan-out on {where}: 1 publisher → {n} receivers, "
        f"{size / 2**20:.0f} MiB; one copy {one:.2f} s{what}; TCP {cc}",
        [
            "system",
            "last receiver (s)",
            "last / one copy",
            "publisher egress (models)",
            "duplicates",
            "CPU s/GB",
            "CPU busy",
            *(["CPU / chain"] if by_chain else []),
            *(["CPU / landed"] if by_landed else []),
            *([f"cores at line rate (of {os.cpu_count()})"] if not loopback else []),
            "sim. median",
            *([f"r{victim} / its bound (sim.)"] if args.case in ("slow", "late") else []),
            *(["step 1 / one copy"] if args.steps > 1 else []),
        ],
        [
            [
                name,
                r["seconds"] if r["seconds"] is not None else "-",
                _ratio(r),
                r["publisher_egress_models"],
                f"{100 * r.get('duplicate_fraction', 0.0):.1f} %",
                f"{r['cpu_seconds_per_gb']:.2f}",
                f"{100 * r['cpu_busy_fraction']:.0f} %",
                *([f"{r['cpu_over_chain']:.2f}"] if by_chain else []),
                *([f"{r['cpu_over_landed_chain']:.2f}"] if by_landed else []),
                *([f"{r['cpu_cores_at_line_rate']:.2f}"] if not loopback else []),
                _simulated(r),
                *([_victim(r)] if args.case in ("slow", "late") else []),
                *([_first_step(r)] if args.steps > 1 else []),
            ]
            for name, r in results.items()
        ],
    )
    for name, r in results.items():
        for k, each in enumerate(r.get("rounds", [r]), 1):
            if not each.get("phases"):
                continue
            which = f", round {k}" if "rounds" in r else ""
            print(
                f"{name}{which}: line-rate use by tenth of the transfer "
                "(publisher out / receivers in: mean, least)"
            )
            print(
                "  "
                + "  ".join(
                    f"{p['publisher_egress']:.2f}/{p['ingress_mean']:.2f},{p['ingress_min']:.2f}"
                    for p in each["phases"]
                )
            )
    if (gloo := results.get("gloo")) is not None and gloo["congestion_control"] != cc:
        print(
            f"gloo ran under TCP {gloo['congestion_control']}, not {cc}: its sockets take no "
            "option, and a namespace defaults only to one the host allows"
        )
    for name, r in results.items():
        if "simulator_error" in r:
            err = r["simulator_error"]
            r["simulator_within_10_percent"] = abs(err) <= 0.10
            of = f"the median of {args.rounds} rounds" if args.rounds > 1 else "one round"
            print(
                f"#18's check, {name}: the simulator is {100 * err:+.1f} % off {of}: "
                + ("within 10 %" if abs(err) <= 0.10 else "NOT within 10 %")
            )
    write_json(
        args.json,
        {
            "bench": "linerate",
            "receivers": n,
            "model_bytes": size,
            "net": args.net,
            "rate_mbit": None if loopback else args.rate,
            "queue_ms": None if loopback else args.queue_ms,
            "case": args.case,
            "victim": victim if args.case != "healthy" else None,
            "rounds": args.rounds,
            "steps": args.steps,
            "machine": machine(),
            "congestion_control": cc,
            "cpu_load": {"cores": args.cpu_load, "cores_used": load.cores_used},
            # Which preset each tensorhub row ran (a name's settings change: "node" was
            # the swarm until session 23, the relay since; bench/prediction_check.py).
            "presets": {_label(name): name for name in args.presets.split(",")},
            **results,
        },
    )


if __name__ == "__main__":
    main()
