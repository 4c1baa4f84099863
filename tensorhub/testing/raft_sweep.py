"""Random fault schedules over a simulated Raft cluster, each reproducible from its seed.

A schedule mixes message loss, duplication, reordering (random latency), partitions,
one-way cuts, crashes (including between persist and send), restarts and snapshots with a
client workload of publishes and linearizable reads. During the run every safety invariant
is checked online; at the end the faults heal and liveness is asserted (a leader within
``LIVENESS_TICKS``, a fresh proposal committed on every node), then the client history is
checked for linearizability.

    python -m tensorhub.testing.raft_sweep --seed 1234        # replay one schedule
    python -m tensorhub.testing.raft_sweep --count 1000       # a sweep
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from ..core.registry import PublishShard, Release, Retain
from .linearizability import INF, Op, check, latest_register_step
from .raft_cluster import Cluster, InvariantViolation, Pending

LIVENESS_TICKS = 200
"""L1 bound: after healing, a leader within 10 maximal election timeouts (10 × 2 × 10 ticks)."""


@dataclass
class SweepResult:
    seed: int
    ops: int
    unknown: int
    ticks: int
    faults: int
    trace: str = ""


def replay_command(seed: int) -> str:
    return f"python -m tensorhub.testing.raft_sweep --seed {seed}"


def _pub(v: int) -> PublishShard:
    return PublishShard("m", v, 0, 1, bytes([v]) * 16, "trainer")


def run_schedule(seed: int) -> SweepResult:
    c = Cluster(
        n=(3, 5)[seed % 2],
        seed=seed,
        latency=(1, (3, 10, 40)[seed % 3]),
        snapshot_every=(0, 0, 7)[seed % 3 if seed % 5 else 2],
    )
    rng = c.rng
    c.run_ticks(30)
    sent: list[Pending | None] = []
    leader = c.leader()
    if leader is not None:
        c.propose(leader, PublishShard("r", 1, 0, 1, bytes(16), "trainer"), kind="retention")
    faults = 0
    for _ in range(12):
        action = rng.randrange(8)
        faults += 1
        if action == 0:
            c.drop_rate = rng.choice((0.0, 0.1, 0.3))
            c.dup_rate = rng.choice((0.0, 0.1))
        elif action == 1:
            nodes = list(c.nodes)
            rng.shuffle(nodes)
            k = rng.randint(1, len(nodes) - 1)
            c.partition(nodes[:k], nodes[k:])
        elif action == 2:
            c.isolate(rng.choice(list(c.nodes)))
        elif action == 3:
            a, b = rng.sample(list(c.nodes), 2)
            c.cut.add((a, b))
        elif action == 4 and c.alive():
            victim = rng.choice(c.alive())
            c.crash(victim)
            c.lose_pending_of(victim)
        elif action == 5 and c.alive():
            c.crash_before_send.add(rng.choice(c.alive()))
        elif action == 6:
            down = [n for n, s in c.nodes.items() if not s.alive]
            if down:
                c.restart(rng.choice(down))
        else:
            c.heal()
            faults -= 1
        for _ in range(rng.randint(1, 4)):
            alive = c.alive()
            if not alive:
                break
            node = rng.choice(alive)
            roll = rng.random()
            if roll < 0.45:
                c.propose(node, _pub(rng.randint(1, 40)))
            elif roll < 0.6:
                # Retention on another model (its history is not checked against the
                # latest-register model, only by I7: each request applies once).
                cmd = (Retain if rng.random() < 0.5 else Release)("r", 1, rng.choice("ab"))
                sent.append(c.propose(node, cmd, kind="retention"))
            elif roll < 0.7 and sent:
                # A client retry: the same request again, to any node (issue #15, 8).
                p = rng.choice(sent)
                if p is not None:
                    c.retry(p, node)
            else:
                c.read(node, "m")
        c.run_ticks(rng.randint(2, 15))
        c.finish_reads()
        for n, s in c.nodes.items():
            if not s.alive:
                c.lose_pending_of(n)
    # Heal everything; liveness must follow within the bound.
    for n, s in c.nodes.items():
        if not s.alive:
            c.restart(n)
    c.heal()
    c.crash_before_send.clear()
    start = c.now
    while c.leader() is None:
        c.run_ticks(1)
        if c.now - start > LIVENESS_TICKS * 10:
            raise InvariantViolation(f"L1: no leader {LIVENESS_TICKS} ticks after healing")
    # A client retries on the current leader until its write commits (the first leader
    # seen after healing may be a stale one about to be deposed); bounded retries.
    for _attempt in range(5):
        probe = c.propose(c.leader() or c.voters[0], _pub(41))
        c.run_ticks(40)
        if probe is not None and probe.result is not None:
            break
    else:
        raise InvariantViolation("L1: no proposal committed within 5 tries after healing")
    c.finish_reads()
    latest = {s.registry.latest("m") for s in c.nodes.values()}
    if latest != {41}:
        raise InvariantViolation(f"L1: nodes did not converge after healing: {latest}")
    c.check_log_matching()
    c.check_applied_once()
    ops = []
    for p in c.history:
        if p.kind == "retention":
            continue
        if p.kind == "read" and p.ret is None:
            continue  # a read that never returned constrains nothing
        result = p.result
        if result in ("already", "stale"):
            result = "stale"
        elif result not in ("committed", None) and p.kind == "publish":
            raise InvariantViolation(f"unexpected publish result {result}")
        ops.append(
            Op(
                p.call,
                INF if p.ret is None else p.ret,
                p.kind,
                p.arg if p.kind == "publish" else None,
                result,
            )
        )
    if not check(ops, 0, latest_register_step):
        raise InvariantViolation(f"I5: history of {len(ops)} ops is not linearizable")
    return SweepResult(
        seed, len(ops), sum(o.ret == INF for o in ops), c.now // 10, faults, c.trace_hash()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    for seed in range(a.seed, a.seed + a.count):
        try:
            r = run_schedule(seed)
        except AssertionError as e:
            print(f"seed {seed}: FAILED: {e}\n  replay: {replay_command(seed)}")
            return 1
        if a.count == 1:
            print(
                f"seed {seed}: ok ({r.ops} ops, {r.unknown} unknown, {r.ticks} ticks, "
                f"{r.faults} faults)"
            )
    print(f"{a.count} schedule(s) passed in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
