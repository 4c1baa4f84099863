"""The data plane's settings in one object, with named presets (after memberlist's
``DefaultLANConfig``/``DefaultWANConfig``): ``NODE`` is what a real node runs; ``SIMULATED``
is what the simulator runs, a named departure from ``NODE`` in which every difference is
listed in ``DEPARTURES`` with the measurement that justifies it (``tests/test_presets.py``
keeps the two in step: a new difference without a reason fails).

Why the simulator departs at all: a simulated chunk is a coarse slice of the model (1/64,
or 1/256 in the pure broadcast, so terabyte models stay tractable) where the node's is
4 MiB. Limits counted in chunks do not carry over: 16 requests in flight of 4 MiB keep a
NIC busy; 16 of a sixty-fourth of a model each would make every fetcher pull most of the
model from a few holders at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .planner import PlannerConfig


@dataclass(frozen=True)
class DataPlaneConfig:
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Which chunk of whom, limits in flight, endgame, owners, back-offs."""
    upload_slots: int = 4
    """Chunk uploads a node runs at once (more only splits the same bandwidth)."""
    max_waiting: int = 256
    """Requests that may wait for an upload slot before more are answered "busy"."""
    near_waiting: int | None = None
    """The same for a requester in our rack (None: as for anyone)."""
    uploads_per_peer: int | None = None
    """Chunk uploads to one peer at once (None: up to ``upload_slots``; see UploadSlots)."""
    reserve_after: float = 1.0
    """Super-seeding: seconds a published chunk's requests are redirected before it is
    sent again (see SuperSeeder)."""
    seed_spare: bool = True
    """Super-seeding: an origin with idle upload slots also sends repeat copies."""
    every_holder_seeds: bool = False
    """Every holder super-seeds, not only the origin: while its upload slots are all busy
    and a chunk is new here (``reserve_after`` from its first send), a request for it is
    redirected to the node it went to (SuperSeeder(origin=False)). Without it, the first
    node to hold a chunk serves it to nearly every other: they all ask it at once, rarest
    first (a receiver at half rate uploaded 59-66 of the 64 chunks of a 256 MiB model, at
    half rate: sim/fanout, seed 1). Off by default: simulated, it took the NIC-limited
    fan-out of 8 from 1.72x one copy to 1.35x at 256 MiB and the standalone step's trainer
    stall from 7.0 to 5.8 s, but the cross-DC step's from 9.5 to 17.8 s (docs/results.md,
    session 15, with the measured fan-out). The 1.72x was the simulator's: it listed
    fetchers as sources before they began (session 19); listed as the node lists them,
    origin-only seeding predicts 1.33-1.41x (seeds 1-3) and every holder 1.35-1.38x, and
    the namespaces measured 1.37-1.80x. ``node:every_holder_seeds=true`` runs it."""
    cut_through: bool = False
    """Serve a chunk while its bytes land here, not once it is verified (the asker
    verifies it against the manifest either way): each hop of a relay then trails its
    upstream by a piece instead of a whole chunk (see serve.serve_decision)."""
    park_starting: bool = False
    """A fetch that began and holds nothing yet parks requests for the version's first
    chunks until their bytes land here, rather than answer "no chunk" (serve.
    serve_decision's ``starting``): a chain then forms at the start of a fetch a piece
    per hop, not a retry and a chunk per hop. Only a relay's downstream asks a link that
    holds nothing (``NODE``); a swarm asks holders. Measured with both settings in each
    round (bench/linerate.py, N=8, 256 MiB, 1 Gbit/s; docs/results.md, session 49): a
    job's first step with a half-rate link 1.203x one copy against 1.218x (12 rounds),
    healthy 1.081x against 1.078x (8), the next step 1.103x against 1.099x (6): within
    the rounds' spread. In a first step the chain formed with few retries either way; in
    a next step a link asked early was parked (its first chunk 7 ms after its upstream's)
    but each connection idle since the last step took 27-48 ms more for its first chunk
    under either setting (TCP ramping up again)."""

    restart_cc_after: float = 0.2
    """Seconds a connection may go without sending a chunk before the next one begins its
    TCP congestion control afresh (``io.tcp.restart_congestion_control``; 0: never). A
    connection idle since the fabric was empty keeps that fabric's round trip, and cubic
    then leaves slow start at once when a stream begins on it mid-transfer (the link
    after a slow or dead one, moving to the link before it). 0.2 s: Linux restarts slow
    start after a retransmission timeout's idle (200 ms at least) anyway, so the window
    is lost by then; what is kept is the stale round trip. Measured (bench/linerate.py,
    N=4, 256 MiB, 1 Gbit/s, 16 rounds each): --case killed, no round over 1.2x one copy
    (1.05-1.18x) against 4 of 16 (1.23-1.38x) without; medians alike (1.07-1.10x); the
    mid-chain slow link's within the rounds' spread; healthy N=8 over 10 rounds each,
    median 1.116x against 1.111x (docs/results.md, session 31)."""

    @property
    def spread_after(self) -> float | None:
        """A fetched copy's super-seeding ``reserve_after`` (None: only origins seed; see
        ``every_holder_seeds`` and seeding.holder_seeder)."""
        return self.reserve_after if self.every_holder_seeds else None


SWARM = DataPlaneConfig()
"""A pure swarm: rarest first from every holder, up to 4 requests per source, an origin that
super-seeds and sends repeat copies with idle slots, each chunk served once verified. The
node's default until the relay met line rate where it did not (``NODE``); kept as a preset
(``swarm``) to compare against, and as the simulator's base (``SIMULATED``)."""

NODE = dataclasses.replace(
    SWARM,
    planner=dataclasses.replace(SWARM.planner, relay=True),
    uploads_per_peer=1,
    seed_spare=False,
    cut_through=True,
    park_starting=True,
)
"""A real node's settings (4 MiB chunks, a planner tick of 10 ms): a pipelined relay as
the starting plan (PlannerConfig.relay) with the swarm as its repair, each upload to one
peer at a time, an origin that sends each chunk once, and each link passing a chunk on
while it lands (``cut_through``). A version sliced across origins swarms
(``ChunkPlanner.relay``), and so does one of fewer than ``relay_min_chunks`` (16) chunks,
whose copy takes less than the chain's waits; the Hub publishes one origin per shard key,
so its fetches of larger versions relay.

Why the relay, on NIC-limited nodes (``bench/linerate.py``, 8 receivers, 1 Gbit/s, last
receiver over one copy, medians of three rounds): 1 GiB 1.016x where the swarm took
1.22-1.26x, 256 MiB 1.04x where it took 1.37-1.99x (session 22); on session 23's slower
host, its cores 91-97 % busy, 1.16x against 1.26x and 1.15x against 1.43x; no duplicate
bytes where the swarm moved 0.8-3.1 %, the publisher at 1.00 model where it sent up to
1.22 (docs/results.md). In a chain the origin's upload slots
are mostly idle (one peer, one upload at a time), and with ``seed_spare`` every fetcher
that fell back to the swarm got repeat copies from it (tests/test_relay.py measured 2.25
models sent with both cores busy). Store and forward, each hop of a chain trails the one
before by a whole chunk: 8 hops of 4 MiB at 1 Gbit/s are 0.27 s, 12 % of a 256 MiB copy
(the simulator: 1.11x one copy, 1.00x cutting through)."""

RELAY = dataclasses.replace(NODE, planner=dataclasses.replace(NODE.planner, relay_min_chunks=1))
"""``NODE`` relaying a version of any size (``PlannerConfig.relay_min_chunks``): what the
name meant while the swarm was the default (launch topologies, bench JSON, results), and
how a test runs a chain over a few chunks."""

SIMULATED = dataclasses.replace(
    SWARM,
    planner=dataclasses.replace(SWARM.planner, total=6, per_source=1, initial_random=1),
    max_waiting=1,
    near_waiting=2,
    cut_through=True,
    park_starting=True,
)
"""The simulator's settings: ``NODE`` but for ``DEPARTURES``. The paper's scenarios run the
swarm; ``sim/fanout.py`` (what ``bench/linerate.py`` prints beside each measured row) runs
whichever preset the bench measures, ``NODE`` included."""

DEPARTURES: dict[str, str] = {
    "planner.total": (
        "6 requests in flight per fetcher, each for a coarse chunk, drawn from 6 distinct "
        "holders (per_source 1): with 2 sources and 4 slots half the downlinks idled "
        "behind busy holders and 50 GB to 48 instances took 1.5x the bound"
    ),
    "planner.per_source": "1 coarse chunk per source at a time (see planner.total)",
    "planner.initial_random": (
        "1 random pick before rarest-first: a simulated chunk is a sixty-fourth of the "
        "model, so one is already enough to have something to serve"
    ),
    "max_waiting": (
        "a request queued behind a busy holder holds one of its fetcher's 6 slots and "
        "moves nothing; queueing 4, a broadcast took 1.12x the bound (last receiver "
        "1.20x), queueing 1: 1.07x (1.09x); docs/results.md, 'broadcast: upload queue'"
    ),
    "near_waiting": (
        "a rack-mate has fewer holders to turn to: with one limit of 1 a rack's last "
        "fetcher finished at 1.12-1.22x the bound, with 2 for the rack 1.09-1.11x"
    ),
    "planner.relay": (
        "the paper's scenarios run the swarm: a simulated chunk is a 64th to a 256th of "
        "the model with one in flight per source, which a chain does not pipeline; with "
        "the node's relay settings (python -m sim reproduce --seeds 3) the as-built "
        "headline ratios moved within 3 % (cross-DC 49.6x -> 51.0x the naive baseline), "
        "and the hypothetical GPUDirect broadcast's last receiver went from <= 1.15x its "
        "bound to 1.199x (tests/test_sim_workloads.py)"
    ),
    "uploads_per_peer": (
        "the relay's (NODE): one upload per peer keeps a chain's chunk whole early; the "
        "simulated swarm keeps the swarm's. Measured with seed_spare off too, swarming: "
        "the standalone step 7.96x -> 8.13x its bound, cross-DC 2.80x -> 2.54x"
    ),
    "seed_spare": (
        "the relay's (NODE): an origin that sends each chunk once sends no repeat copies "
        "to links fallen back to the swarm; the simulated swarm keeps the swarm's spare "
        "copies (see uploads_per_peer for what both together measured)"
    ),
}
"""Each setting in which ``SIMULATED`` differs from ``NODE``, and why."""


PRESETS: dict[str, DataPlaneConfig] = {
    "node": NODE,
    "relay": RELAY,
    "swarm": SWARM,
    "simulated": SIMULATED,
}
"""The presets by name (``Hub.start(dataplane=...)``, ``bench/linerate.py --presets``)."""


def preset(name: str) -> DataPlaneConfig:
    """A preset by name, optionally with settings changed: ``node:max_waiting=8`` or
    ``node:planner.per_source=2:seed_spare=false`` (what an experiment on one setting
    passes to every process of a run, as a string)."""
    base, *changes = name.split(":")
    try:
        cfg = PRESETS[base]
    except KeyError:
        raise ValueError(f"no data-plane preset {base!r}; there are {sorted(PRESETS)}") from None
    for change in changes:
        cfg = _changed(cfg, change, name)
    return cfg


def _changed(cfg: DataPlaneConfig, change: str, name: str) -> DataPlaneConfig:
    key, sep, text = change.partition("=")
    owner: Any = cfg.planner if key.startswith("planner.") else cfg
    field_name = key.removeprefix("planner.")
    fields = {f.name: f for f in dataclasses.fields(owner)}
    if not sep or field_name not in fields:
        raise ValueError(f"preset {name!r}: {change!r} is not a known setting=value")
    value: Any = _parse(text, str(fields[field_name].type), name)
    if owner is cfg:
        out: DataPlaneConfig = dataclasses.replace(cfg, **{field_name: value})
        return out
    planner: PlannerConfig = dataclasses.replace(cfg.planner, **{field_name: value})
    return dataclasses.replace(cfg, planner=planner)


def _parse(text: str, kind: str, name: str) -> object:
    """``text`` as the setting's declared type (``kind``: "int", "float", "bool",
    "int | None"), so a count cannot become a float or a flag a number."""
    low = text.lower()
    if low == "none":
        if "None" not in kind:
            raise ValueError(f"preset {name!r}: this setting cannot be none")
        return None
    if kind == "bool":
        if low not in ("true", "false"):
            raise ValueError(f"preset {name!r}: {text!r} is not true or false")
        return low == "true"
    try:
        return float(text) if kind == "float" else int(text)
    except ValueError:
        raise ValueError(f"preset {name!r}: {text!r} is not a number of kind {kind}") from None


def differences(a: DataPlaneConfig, b: DataPlaneConfig) -> set[str]:
    """The settings (dotted names) in which two configs differ."""
    out = set()
    for f in dataclasses.fields(DataPlaneConfig):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            out |= {
                f"{f.name}.{g.name}"
                for g in dataclasses.fields(x)
                if getattr(x, g.name) != getattr(y, g.name)
            }
        elif x != y:
            out.add(f.name)
    return out
