"""Scenario tests over the simulated network: elections, partitions, crashes, snapshots,
learners, leader transfer and ReadIndex. Each cluster is seeded and prints its seed."""

from __future__ import annotations

import pytest

from tensorhub.core.raft import RaftMessage, ReadState, Role
from tensorhub.core.raft.types import MsgType
from tensorhub.core.registry import PublishShard
from tensorhub.testing.raft_cluster import Cluster

from .helpers import core, msg, take


def cluster(n: int = 3, seed: int = 0, **kw: object) -> Cluster:
    print(f"[seed] Cluster(n={n}, seed={seed}, {kw})")
    return Cluster(n, seed, **kw)  # type: ignore[arg-type]


def pub(v: int, model: str = "m") -> PublishShard:
    return PublishShard(model, v, 0, 1, bytes([v % 256]) * 16, "trainer")


def settle(c: Cluster, ticks: int = 60) -> str:
    c.run_ticks(ticks)
    lead = c.leader()
    assert lead is not None, "no leader elected"
    return lead


def commit(c: Cluster, versions: range, ticks: int = 10) -> None:
    for v in versions:
        lead = c.leader()
        assert lead is not None
        assert c.propose(lead, pub(v)) is not None
        c.run_ticks(1)
    c.run_ticks(ticks)


def latest(c: Cluster, nid: str, model: str = "m") -> int:
    return c.nodes[nid].registry.latest(model)


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_elects_exactly_one_leader(n: int, seed: int) -> None:
    c = cluster(n, seed)
    lead = settle(c)
    assert [x for x in c.nodes if c.nodes[x].core.role is Role.LEADER] == [lead]
    assert all(s.core.lead == lead for s in c.nodes.values())


@pytest.mark.parametrize("seed", range(3))
def test_isolated_leader_is_replaced_and_steps_down(seed: int) -> None:
    c = cluster(3, seed)
    old = settle(c)
    commit(c, range(1, 4))
    c.isolate(old)
    c.run_ticks(60)
    new = c.leader()
    assert new is not None and new != old
    # CheckQuorum: the isolated leader notices it lost its quorum and steps down.
    assert c.nodes[old].core.role is not Role.LEADER
    commit(c, range(4, 6))
    c.heal()
    c.run_ticks(30)
    assert all(latest(c, x) == 5 for x in c.nodes)
    c.check_log_matching()


@pytest.mark.parametrize("seed", range(3))
def test_rejoining_node_does_not_disrupt_the_leader(seed: int) -> None:
    """PreVote: a node cut off for a long time does not inflate its term or depose anyone."""
    c = cluster(3, seed)
    lead = settle(c)
    term = c.nodes[lead].core.term
    follower = next(x for x in c.voters if x != lead)
    c.isolate(follower)
    c.run_ticks(200)
    assert c.nodes[follower].core.term == term
    c.heal()
    c.run_ticks(50)
    assert c.leader() == lead and c.nodes[lead].core.term == term


@pytest.mark.parametrize("seed", range(3))
def test_partial_partition_causes_no_election_storm(seed: int) -> None:
    """Cloudflare 2020: one link between the leader and a follower fails; the rest works.
    PreVote + CheckQuorum keep terms stable and commits flowing."""
    c = cluster(3, seed)
    lead = settle(c)
    other = next(x for x in c.voters if x != lead)
    c.cut |= {(lead, other), (other, lead)}
    c.run_ticks(30)
    terms_before = {x: s.core.term for x, s in c.nodes.items()}
    commit(c, range(1, 6), ticks=30)
    c.run_ticks(200)
    assert max(s.core.term for s in c.nodes.values()) <= max(terms_before.values()) + 1
    assert latest(c, c.leader() or lead) == 5


@pytest.mark.parametrize("seed", range(3))
def test_one_way_link_keeps_the_cluster_stable(seed: int) -> None:
    c = cluster(3, seed)
    lead = settle(c)
    f = next(x for x in c.voters if x != lead)
    c.cut.add((f, lead))  # f hears the leader but cannot answer it
    term = c.nodes[lead].core.term
    commit(c, range(1, 4), ticks=100)
    assert c.nodes[lead].core.term == term and c.leader() == lead
    assert latest(c, lead) == 3


@pytest.mark.parametrize("seed", range(20))
def test_figure8_unreliable(seed: int) -> None:
    """6.824's Figure8Unreliable: leaders crash while the network drops and reorders; no
    committed entry is ever lost or changed, and everything converges after healing."""
    c = cluster(5, seed, latency=(1, 40))
    c.run_ticks(40)
    c.drop_rate = 0.1
    v = 0
    for _ in range(40):
        lead = c.leader()
        if lead is not None:
            v += 1
            c.propose(lead, pub(v))
        c.run_ticks(c.rng.randint(1, 12))
        if lead is not None and c.rng.random() < 0.5:
            c.crash(lead)
        down = [x for x, s in c.nodes.items() if not s.alive]
        if len(down) >= 2 or (down and c.rng.random() < 0.5):
            c.restart(c.rng.choice(down))
    for x, s in c.nodes.items():
        if not s.alive:
            c.restart(x)
    c.heal()
    lead = settle(c, 80)
    v += 1
    c.propose(lead, pub(v))
    c.run_ticks(40)
    c.check_log_matching()
    top = {latest(c, x) for x in c.nodes}
    assert top == {v}, f"nodes disagree after heal: {top}"


def test_crash_between_persist_and_send_keeps_acknowledged_entries() -> None:
    c = cluster(3, 1)
    lead = settle(c)
    commit(c, range(1, 3))
    for x in c.voters:
        if x != lead:
            c.crash_before_send.add(x)  # each follower dies right after its next fsync
    c.propose(lead, pub(3))
    c.run_ticks(5)
    for x in c.voters:
        if not c.nodes[x].alive:
            c.restart(x)
    c.run_ticks(40)
    lead = c.leader()
    assert lead is not None
    commit(c, range(4, 5))
    assert all(latest(c, x) == 4 for x in c.nodes)


@pytest.mark.parametrize("seed", range(3))
def test_all_voters_restart_at_once(seed: int) -> None:
    """PySyncObj #201: every voter restarts together; nothing acknowledged is lost."""
    c = cluster(3, seed)
    settle(c)
    commit(c, range(1, 6))
    assert all(latest(c, x) == 5 for x in c.nodes)
    for x in c.voters:
        c.crash(x)
    for x in c.voters:
        c.restart(x)
    settle(c, 80)
    commit(c, range(6, 7))
    assert all(latest(c, x) == 6 for x in c.nodes)
    c.check_log_matching()


@pytest.mark.parametrize("seed", range(3))
def test_single_voter_crash_after_acknowledged_write(seed: int) -> None:
    """etcd #14370: a write acknowledged by a quorum survives the crash of a voter in it."""
    c = cluster(3, seed)
    lead = settle(c)
    f1, f2 = (x for x in c.voters if x != lead)
    c.isolate(f2)
    p = c.propose(lead, pub(1))
    c.run_ticks(10)
    assert p is not None and p.result == "committed"  # acknowledged by lead + f1
    c.crash(lead)
    c.heal()
    c.isolate(lead)
    c.restart(f1)  # f1 crashed too and came back from its disk
    c.run_ticks(80)
    new = c.leader()
    assert new in (f1, f2)
    c.run_ticks(20)
    assert latest(c, f2) == 1  # f2 learned the write from f1's durable log


@pytest.mark.parametrize("seed", range(5))
def test_loss_duplication_and_reordering(seed: int) -> None:
    c = cluster(5, seed, latency=(1, 30))
    settle(c)
    c.drop_rate, c.dup_rate = 0.2, 0.2
    for v in range(1, 21):
        lead = c.leader()
        if lead is not None:
            c.propose(lead, pub(v))
        c.run_ticks(3)
    c.heal()
    lead = settle(c, 60)
    c.propose(lead, pub(100))
    c.run_ticks(30)
    assert all(latest(c, x) == 100 for x in c.nodes)
    c.check_log_matching()


def test_lagging_follower_catches_up_by_snapshot() -> None:
    c = cluster(3, 7, snapshot_every=5)
    lead = settle(c)
    laggard = next(x for x in c.voters if x != lead)
    c.isolate(laggard)
    commit(c, range(1, 31))
    assert c.nodes[lead].core.log.snapshot_index > 20  # the leader compacted its log
    c.heal()
    c.run_ticks(40)
    assert latest(c, laggard) == 30
    assert c.nodes[laggard].core.log.snapshot_index > 0  # it got there via InstallSnapshot
    c.crash(laggard)
    c.restart(laggard)  # and the snapshot is durable
    assert latest(c, laggard) >= 25


def test_learner_replicates_but_does_not_vote_or_count() -> None:
    c = cluster(3, 3, learners=1)
    settle(c)
    commit(c, range(1, 4))
    assert latest(c, "l0") == 3
    assert c.nodes["l0"].core.role is Role.FOLLOWER
    lead = c.leader()
    assert lead is not None
    for x in c.voters:
        if x != lead:
            c.crash(x)
    p = c.propose(lead, pub(4))
    c.run_ticks(30)
    assert p is not None and p.result is None  # leader + learner is no quorum
    c.isolate(lead)
    c.run_ticks(100)
    assert c.nodes["l0"].core.role is Role.FOLLOWER  # a learner never campaigns


def test_leader_transfer() -> None:
    c = cluster(3, 5)
    lead = settle(c)
    commit(c, range(1, 3))
    target = next(x for x in c.voters if x != lead)
    c.nodes[lead].core.transfer_leader(target)
    c.process(c.nodes[lead])
    c.run_ticks(10)
    assert c.leader() == target
    commit(c, range(3, 4))
    assert all(latest(c, x) == 3 for x in c.nodes)


def test_read_index_on_a_follower_sees_the_latest_commit() -> None:
    c = cluster(3, 2)
    lead = settle(c)
    commit(c, range(1, 6))
    f = next(x for x in c.voters if x != lead)
    r = c.read(f, "m")
    c.run_ticks(5)
    c.finish_reads()
    assert r is not None and r.result == 5


def test_partitioned_old_leader_never_serves_a_stale_read() -> None:
    c = cluster(3, 4)
    old = settle(c)
    commit(c, range(1, 2))
    c.isolate(old)
    r = c.read(old, "m")
    c.run_ticks(60)
    commit(c, range(2, 3))
    c.finish_reads()
    assert r is not None and r.ret is None  # never answered: it could not confirm leadership
    c.heal()
    c.run_ticks(40)
    c.finish_reads()
    assert r.ret is None


def test_new_leader_serves_reads_only_after_its_noop_commits() -> None:
    """A fresh leader's commit index may lag; ReadIndex waits for its no-op to commit."""
    c = core(terms=(1, 1), term=1, commit=1)
    c.campaign()
    for v in ("2", "3"):
        c.step(msg(MsgType.VOTE_RESP, v, "1", term=c.term))
    appends = [m for m in take(c) if m.type == MsgType.APP]
    c.read_index(b"r1")
    assert not take(c) and not c.read_states  # held back: no heartbeat, no read state yet
    for m in appends:
        c.step(msg(MsgType.APP_RESP, m.to, "1", term=c.term, index=m.index + len(m.entries)))
    beats = [m for m in take(c) if m.type == MsgType.HEARTBEAT]
    assert beats and all(m.context == b"r1" for m in beats)
    c.step(msg(MsgType.HEARTBEAT_RESP, "2", "1", term=c.term, context=b"r1"))
    assert c.read_states == [ReadState(3, b"r1")]  # includes the no-op at index 3


def _figure8(c: Cluster) -> None:
    """Raft paper figure 8, scripted: an entry of an old term reaches a majority under a new
    leader, which crashes; a node with a newer-term entry at that index is then elected."""
    from tensorhub.core.raft.types import MsgType as T

    def elect(nid: str) -> None:
        for _ in range(3):  # a campaign may land on a term others already voted in
            c.nodes[nid].core.campaign()
            c.process(c.nodes[nid])
            c.run(20)
            if c.nodes[nid].core.role is Role.LEADER:
                return
        raise AssertionError(f"{nid} was not elected")

    elect("n0")
    c.run(30)
    base = c.nodes["n0"].core.log.last_index()
    # (a) n0 replicates X (term t) to n1 only.
    c.drop_if = lambda m: m.frm == "n0" and m.type == T.APP and m.to != "n1"
    c.propose("n0", pub(1))
    c.run(20)
    assert c.nodes["n1"].core.log.last_index() == base + 1
    # (b) n0 crashes; n4 is elected by n2, n3, n4 and writes Y (newer term) at that index,
    # on its own log only.
    c.crash("n0")
    c.drop_if = lambda m: m.frm == "n4" and m.type == T.APP
    elect("n4")
    c.crash("n4")
    # (c) n0 comes back, is elected by n0, n1, n2 and copies X to n2 — one entry per message,
    # and nothing after it: X is now on a majority, but X is from an older term.
    c.restart("n0")

    def only_x_to_n2(m: RaftMessage) -> bool:
        if m.frm != "n0" or m.type != T.APP or m.to == "n1":
            return False  # n1 gets everything: it acknowledges X (and n0's no-op)
        if m.to == "n2" and c.nodes["n2"].core.log.last_index() <= base:
            return False  # n2 lacks X: it rejects the probe, then takes X alone
        return bool(m.entries)  # nothing more for anyone: X is on exactly n0, n1, n2

    c.drop_if = only_x_to_n2
    elect("n0")
    c.run(20)
    assert c.nodes["n2"].core.log.term(base + 1) == c.nodes["n1"].core.log.term(base + 1)
    # Correct Raft does not commit X here (figure 8): its term is not n0's.
    assert c.nodes["n0"].core.log.committed == base
    # (d) n0 crashes; n4 returns and wins with Y; Y overwrites X. Safe only because X was
    # never committed — the harness would flag I3 otherwise.
    c.crash("n0")
    c.drop_if = None
    c.restart("n4")
    elect("n4")
    c.run_ticks(10)


def test_figure8_old_term_entry_is_not_committed_by_count() -> None:
    from tensorhub.core.raft import RaftConfig

    cfg = RaftConfig(max_entries_per_msg=1, pre_vote=False, check_quorum=False)
    c = cluster(5, 0, config=cfg, latency=(1, 1))
    _figure8(c)
    c.check_log_matching()


def test_a_retried_retain_after_a_release_applies_once() -> None:
    """Issue #15 (8), as the outside checker found it: retain v1, release v1, then the
    retain again (a client's retry on another node) left v1 retained everywhere."""
    from tensorhub.core.registry import Release, Retain

    c = Cluster(3, 1)
    c.run_ticks(50)
    lead = c.leader()
    assert lead is not None
    c.propose(lead, pub(1))
    c.run_ticks(20)
    retain = c.propose(lead, Retain("m", 1, "a"), kind="retain")
    c.run_ticks(20)
    release = c.propose(lead, Release("m", 1, "a"), kind="release")
    c.run_ticks(20)
    assert retain is not None and release is not None
    assert (retain.result, release.result) == ("ok", "ok")
    follower = next(n for n in c.nodes if n != lead)
    assert c.retry(retain, follower)
    c.run_ticks(40)
    assert all(s.registry.version("m", 1).retained == [] for s in c.nodes.values())  # type: ignore[union-attr]
    c.check_applied_once()
