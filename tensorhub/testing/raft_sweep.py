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

from ..core.raft import RaftConfig
from ..core.registry import PublishShard, Release, Retain
from .linearizability import INF, Op, check, latest_register_step
from .raft_cluster import Cluster, InvariantViolation, Pending

PROBE_VERSION = 1 << 20
"""The version the liveness probe publishes after healing: above any the schedule used."""
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


def replay_command(seed: int, adversarial: bool = False) -> str:
    flag = " --adversarial" if adversarial else ""
    return f"python -m tensorhub.testing.raft_sweep --seed {seed}{flag}"


def _pub(v: int) -> PublishShard:
    return PublishShard("m", v, 0, 1, v.to_bytes(16, "big"), "trainer")


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
    return _heal_and_check(c, seed, faults)


def _heal_and_check(c: Cluster, seed: int, faults: int, settle: int = 0) -> SweepResult:
    """Heal everything; liveness must follow within the bound; then every check.

    ``settle``: ticks every node may take, after the probe committed, to apply it. The
    plain sweep allows none; the adversarial one (PreVote and CheckQuorum off for half its
    seeds, where a restarted node's election may depose the leader just after the commit)
    allows ``LIVENESS_TICKS`` (seed 50475 needed it)."""
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
        probe = c.propose(c.leader() or c.voters[0], _pub(PROBE_VERSION))
        c.run_ticks(40)
        if probe is not None and probe.result is not None:
            break
    else:
        raise InvariantViolation("L1: no proposal committed within 5 tries after healing")
    for _ in range(settle):
        if all(s.registry.latest("m") == PROBE_VERSION for s in c.nodes.values()):
            break
        c.run_ticks(1)
    c.finish_reads()
    latest = {s.registry.latest("m") for s in c.nodes.values()}
    if latest != {PROBE_VERSION}:
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


def run_adversarial(seed: int) -> SweepResult:
    """Faults aimed at the leader, where Raft's subtle rules matter.

    Random schedules rarely build the two histories that break a Raft without its subtle
    rules, so these are drawn on purpose, in random order and timing:

    - **figure 8**: the leader appends entries that reach at most one follower, then
      crashes; others lead, restarts bring it back. A leader that commits an entry of an
      earlier term by counting replicas loses a committed entry (I3).
    - **stale leader read**: the leader is cut off; the majority elects a new one and
      commits; reads go to the old leader meanwhile. A leader that serves a read without
      confirming it still leads returns a stale value (I5).
    """
    # One entry per append (etcd's tests shrink MaxSizePerMsg too): a follower can then
    # match a leader exactly at an entry of an earlier term, below the new leader's no-op,
    # which is what figure 8 needs; with whole batches the no-op rides along and hides it.
    cfg = RaftConfig(
        max_entries_per_msg=1 + seed % 2, pre_vote=seed % 4 < 2, check_quorum=seed % 4 < 2
    )
    c = Cluster(n=(5, 3)[seed % 3 == 0], seed=seed, latency=(1, 3), config=cfg)
    rng = c.rng
    c.run_ticks(30)
    faults = 0
    v = 0

    def publish(node: str) -> None:
        nonlocal v
        v += 1
        c.propose(node, _pub(v))

    for _ in range(16):
        lead = c.leader()
        down = [n for n, s in c.nodes.items() if not s.alive]
        action = rng.randrange(5)
        faults += 1
        if lead is None or action == 0:
            if down and rng.random() < 0.7:
                # The down node with the newest last term first: the one whose comeback can
                # overwrite what a careless leader committed.
                c.restart(max(down, key=lambda n: (c.nodes[n].core.log.last_term(), n)))
            c.heal()
            faults -= 1
        elif action == 1:  # figure 8, first half: a tail that reaches at most one follower
            others = [n for n in c.alive() if n != lead]
            keep = rng.sample(others, rng.randint(0, min(1, len(others))))
            c.partition([lead, *keep], [n for n in c.nodes if n not in keep and n != lead])
            for _k in range(rng.randint(1, 3)):
                publish(lead)
            c.run_ticks(rng.randint(1, 4))
            c.crash(lead)
            c.lose_pending_of(lead)
            c.heal()
        elif action == 2:  # figure 8, second half: whoever commits next dies at that moment
            c.crash_after_commit.update(c.alive())
            publish(lead)
        elif action == 3:  # stale leader read
            c.isolate(lead)
            for _k in range(rng.randint(10, 40)):
                c.run_ticks(1)
                new = c.leader()
                if new is not None and new != lead and rng.random() < 0.3:
                    publish(new)
                if rng.random() < 0.3 and c.nodes[lead].alive:
                    c.read(lead, "m")
                c.finish_reads()
            c.heal()
        else:
            for _k in range(rng.randint(1, 4)):
                node = rng.choice(c.alive()) if c.alive() else None
                if node is not None:
                    publish(node) if rng.random() < 0.6 else c.read(node, "m")
        c.run_ticks(rng.randint(1, 12))
        c.finish_reads()
        for n, s in c.nodes.items():
            if not s.alive:
                c.lose_pending_of(n)
    c.crash_after_commit.clear()
    return _heal_and_check(c, seed, faults, settle=LIVENESS_TICKS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument(
        "--adversarial", action="store_true", help="faults aimed at the leader (run_adversarial)"
    )
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    run = run_adversarial if a.adversarial else run_schedule
    for seed in range(a.seed, a.seed + a.count):
        try:
            r = run(seed)
        except AssertionError as e:
            print(f"seed {seed}: FAILED: {e}\n  replay: {replay_command(seed, a.adversarial)}")
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
