"""Hypothesis drives the simulated cluster: faults, crashes and client ops in any order.

The cluster checks I1 (election safety), I3 (state-machine safety and committed entries in
every new leader), I4 (durable term and vote) and I6 (version monotonicity, one root per
version) online at every step; I2 (log matching) is checked after every rule. Hypothesis
shrinks any failing schedule to a minimal one.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tensorhub.core.registry import PublishShard, Release, Retain
from tensorhub.testing.raft_cluster import Cluster, Pending


class RaftMachine(RuleBasedStateMachine):
    c: Cluster

    @initialize(
        seed=st.integers(0, 2**32 - 1), n=st.sampled_from([3, 5]), snap=st.sampled_from([0, 4])
    )
    def boot(self, seed: int, n: int, snap: int) -> None:
        print(f"[seed] Cluster(n={n}, seed={seed}, snapshot_every={snap})")
        self.c = Cluster(n, seed, latency=(1, 20), snapshot_every=snap)
        self.sent: list[Pending] = []
        # Start from a working cluster with v1 committed, so that the rules' retains and
        # releases (and their duplicates) act on a real version from the first step.
        while self.c.leader() is None:
            self.c.run_ticks(5)
        self.c.propose(self.c.leader() or "n0", PublishShard("m", 1, 0, 1, bytes(16), "t"))
        self.c.run_ticks(60)

    def _node(self, i: int) -> str:
        return list(self.c.nodes)[i % len(self.c.nodes)]

    @rule(
        ticks=st.integers(1, 25), again=st.none() | st.tuples(st.integers(0, 99), st.integers(0, 4))
    )
    def run(self, ticks: int, again: tuple[int, int] | None) -> None:
        self.c.run_ticks(ticks)
        self.c.finish_reads()
        if again is not None and self.sent:
            # A client re-sends an earlier retain or release to some node (a retry after a
            # timeout; issue #15, 8). Part of this rule so that it is drawn often.
            k, i = again
            self.c.retry(self.sent[k % len(self.sent)], self._node(i))

    @rule(rate=st.sampled_from([0.0, 0.1, 0.3]), dup=st.sampled_from([0.0, 0.2]))
    def lossy(self, rate: float, dup: float) -> None:
        self.c.drop_rate, self.c.dup_rate = rate, dup

    @rule(i=st.integers(0, 4))
    def isolate(self, i: int) -> None:
        self.c.isolate(self._node(i))

    @rule(data=st.data())
    def partition(self, data: st.DataObject) -> None:
        nodes = list(self.c.nodes)
        side = data.draw(st.sets(st.sampled_from(nodes), min_size=1, max_size=len(nodes) - 1))
        self.c.partition(side, set(nodes) - side)

    @rule()
    def isolate_leader(self) -> None:
        lead = self.c.leader()
        if lead is not None:
            self.c.isolate(lead)

    @rule(v=st.integers(1, 30))
    def publish_at_leader(self, v: int) -> None:
        lead = self.c.leader()
        if lead is not None:
            self.c.propose(lead, PublishShard("m", v, 0, 1, bytes([v]) * 16, "t"))

    @rule()
    def crash_leader(self) -> None:
        lead = self.c.leader()
        if lead is not None:
            self.c.crash(lead)
            self.c.lose_pending_of(lead)

    @rule()
    def heal(self) -> None:
        self.c.heal()

    @rule(i=st.integers(0, 4))
    def crash(self, i: int) -> None:
        nid = self._node(i)
        self.c.crash(nid)
        self.c.lose_pending_of(nid)

    @rule(i=st.integers(0, 4))
    def crash_after_next_fsync(self, i: int) -> None:
        self.c.crash_before_send.add(self._node(i))

    @precondition(lambda self: any(not s.alive for s in self.c.nodes.values()))
    @rule(i=st.integers(0, 4))
    def restart(self, i: int) -> None:
        down = [n for n, s in self.c.nodes.items() if not s.alive]
        self.c.restart(down[i % len(down)])

    @rule(i=st.integers(0, 4), v=st.integers(1, 30))
    def publish(self, i: int, v: int) -> None:
        nid = self._node(i)
        if self.c.nodes[nid].alive:
            self.c.propose(nid, PublishShard("m", v, 0, 1, bytes([v]) * 16, "t"))

    @rule(i=st.integers(0, 4))
    def read(self, i: int) -> None:
        nid = self._node(i)
        if self.c.nodes[nid].alive:
            self.c.read(nid, "m")

    def _committed(self, k: int) -> int:
        """One of the committed versions some node knows (retain needs one), else 1."""
        vs = sorted({v for s in self.c.nodes.values() for v in s.registry.committed_versions("m")})
        return vs[k % len(vs)] if vs else 1

    @rule(i=st.integers(0, 4), k=st.integers(0, 9), holder=st.sampled_from(["a", "b"]))
    def retain(self, i: int, k: int, holder: str) -> None:
        nid = self._node(i)
        if self.c.nodes[nid].alive:
            p = self.c.propose(nid, Retain("m", self._committed(k), holder), kind="retain")
            if p is not None:
                self.sent.append(p)

    @rule(i=st.integers(0, 4), k=st.integers(0, 9), holder=st.sampled_from(["a", "b"]))
    def release(self, i: int, k: int, holder: str) -> None:
        nid = self._node(i)
        if self.c.nodes[nid].alive:
            p = self.c.propose(nid, Release("m", self._committed(k), holder), kind="release")
            if p is not None:
                self.sent.append(p)

    @invariant()
    def logs_match(self) -> None:
        self.c.check_log_matching()

    @invariant()
    def each_request_applies_once(self) -> None:
        self.c.check_applied_once()


RaftMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestRaftStateMachine = RaftMachine.TestCase
