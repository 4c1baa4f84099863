"""Ports of etcd-io/raft's raft_paper_test.go: the Raft paper's rules, one by one."""

from __future__ import annotations

import pytest

from tensorhub.core.raft import Entry, Role
from tensorhub.core.raft.types import MsgType

from .helpers import IDS, PAPER, core, elect, msg, persist_all, take


@pytest.mark.parametrize("role", ["follower", "candidate", "leader"])
def test_update_term_from_message(role: str) -> None:
    """§5.1: a node seeing a higher term adopts it and becomes follower."""
    c = core()
    if role == "candidate":
        c.campaign()
    elif role == "leader":
        elect(c)
    c.step(msg(MsgType.APP, "2", "1", term=2))
    assert c.term == 2 and c.role is Role.FOLLOWER


def test_reject_stale_term_message() -> None:
    """§5.1: a request with a stale term is ignored."""
    c = core(term=2)
    c.step(msg(MsgType.APP, "2", "1", term=1, index=0, log_term=0, entries=(Entry(1, 1, b"x"),)))
    assert c.log.last_index() == 0


def test_start_as_follower() -> None:
    c = core()
    assert c.role is Role.FOLLOWER


def test_leader_bcast_beat() -> None:
    """§5.2: a leader sends heartbeats every heartbeat interval."""
    c = core()
    elect(c)
    for _ in range(PAPER.heartbeat_tick):
        c.tick()
    beats = sorted((m.to, m.type) for m in take(c))
    assert beats == [("2", MsgType.HEARTBEAT), ("3", MsgType.HEARTBEAT)]


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_nonleader_start_election(role: str) -> None:
    """§5.2: after an election timeout a non-leader starts an election."""
    c = core(term=1)
    if role == "candidate":
        c.become_candidate()  # term 2
    start = c.term
    for _ in range(2 * PAPER.election_tick):
        c.tick()
    assert c.role is Role.CANDIDATE and c.term == start + 1 and c.vote == "1"
    sent = sorted((m.to, m.type, m.term) for m in take(c))
    assert sent == [("2", MsgType.VOTE, start + 1), ("3", MsgType.VOTE, start + 1)]


@pytest.mark.parametrize(
    ("size", "votes", "role"),
    [
        (1, {}, Role.LEADER),
        (3, {"2": True, "3": True}, Role.LEADER),
        (3, {"2": True}, Role.LEADER),
        (5, {"2": True, "3": True, "4": True, "5": True}, Role.LEADER),
        (5, {"2": True, "3": True}, Role.LEADER),
        (3, {"2": False, "3": False}, Role.FOLLOWER),
        (5, {"2": False, "3": False, "4": False, "5": False}, Role.FOLLOWER),
        (5, {"2": True, "3": False, "4": False, "5": False}, Role.FOLLOWER),
        (3, {}, Role.CANDIDATE),
        (5, {"2": True}, Role.CANDIDATE),
        (5, {"2": False, "3": False}, Role.CANDIDATE),
    ],
)
def test_leader_election_in_one_round(size: int, votes: dict[str, bool], role: Role) -> None:
    """§5.2: win with a majority, lose to a majority of rejections, else stay candidate."""
    ids = tuple(str(i) for i in range(1, size + 1))
    c = core(voters=ids)
    c.campaign()
    for frm, granted in votes.items():
        c.step(msg(MsgType.VOTE_RESP, frm, "1", term=c.term, reject=not granted))
    assert c.role is role and c.term == 1


@pytest.mark.parametrize(
    ("vote", "frm", "reject"),
    [
        (None, "2", False),
        (None, "3", False),
        ("2", "2", False),
        ("3", "3", False),
        ("2", "3", True),
        ("3", "2", True),
    ],
)
def test_follower_vote(vote: str | None, frm: str, reject: bool) -> None:
    """§5.2: a follower votes for at most one candidate per term, first come first served."""
    c = core(term=1, vote=vote)
    c.step(msg(MsgType.VOTE, frm, "1", term=1))
    (m,) = take(c)
    assert (m.type, m.to, m.reject) == (MsgType.VOTE_RESP, frm, reject)


@pytest.mark.parametrize("term", [1, 2])
def test_candidate_fallback(term: int) -> None:
    """§5.2: a candidate that hears from a leader of a term ≥ its own becomes follower."""
    c = core()
    c.campaign()
    assert c.role is Role.CANDIDATE
    c.step(msg(MsgType.APP, "2", "1", term=term))
    assert c.role is Role.FOLLOWER and c.term == term


@pytest.mark.parametrize("role", ["follower", "candidate"])
def test_election_timeout_randomized(role: str) -> None:
    """§5.2: election timeouts are drawn from [et, 2et), and all of them occur."""
    seen = set()
    for seed in range(200):
        c = core(seed=seed)
        if role == "candidate":
            c.become_candidate()
        term = c.term
        ticks = 0
        while c.term == term:
            c.tick()
            ticks += 1
        seen.add(ticks)
    assert seen == set(range(PAPER.election_tick, 2 * PAPER.election_tick))


def test_election_timeout_nonconflict() -> None:
    """§5.2: in most cases only one of several followers times out first."""
    conflicts = 0
    for seed in range(1000):
        cores = [
            core(str(i), tuple(str(j) for j in range(1, 6)), seed=seed * 10 + i)
            for i in range(1, 6)
        ]
        timed_out = False
        while not timed_out:
            fired = 0
            for c in cores:
                c.tick()
                fired += bool(c.msgs)
            if fired:
                timed_out = True
                conflicts += fired > 1
    assert conflicts / 1000 <= 0.3


def test_leader_start_replication() -> None:
    """§5.3: a proposal is appended to the leader's log and sent to every follower."""
    c = core()
    elect(c)
    persist_all(c)
    take(c)
    c.propose(b"some data")
    li = c.log.last_index()
    assert li == 2  # the no-op, then ours
    sent = take(c)
    assert sorted(m.to for m in sent) == ["2", "3"]
    for m in sent:
        assert m.type == MsgType.APP and m.index == 1 and m.log_term == 1
        assert m.entries == (Entry(1, 2, b"some data"),)


def test_leader_commit_entry() -> None:
    """§5.3: once a majority has an entry it is committed, and followers learn it."""
    c = core()
    elect(c)
    persist_all(c)
    take(c)
    c.propose(b"data")
    for m in take(c):
        c.step(msg(MsgType.APP_RESP, m.to, "1", term=1, index=m.index + len(m.entries)))
    assert c.log.committed == 2
    assert [e.data for e in c.log.next_committed()][-1] == b"data"
    assert all(m.commit == 2 for m in take(c) if m.type == MsgType.APP)


@pytest.mark.parametrize(
    ("size", "acks", "committed"),
    [
        (1, set(), True),
        (3, set(), False),
        (3, {"2"}, True),
        (3, {"2", "3"}, True),
        (5, set(), False),
        (5, {"2"}, False),
        (5, {"2", "3"}, True),
        (5, {"2", "3", "4", "5"}, True),
    ],
)
def test_leader_acknowledge_commit(size: int, acks: set[str], committed: bool) -> None:
    ids = tuple(str(i) for i in range(1, size + 1))
    c = core(voters=ids)
    elect(c)
    persist_all(c)
    c.propose(b"x")
    for m in take(c):
        if m.to in acks:
            c.step(msg(MsgType.APP_RESP, m.to, "1", term=1, index=m.index + len(m.entries)))
    assert (c.log.committed >= c.log.last_index()) is committed


@pytest.mark.parametrize("terms", [(), (2,), (1, 1), (1, 2, 2)])
def test_leader_commit_preceding_entries(terms: tuple[int, ...]) -> None:
    """§5.3: committing an entry of the current term commits every entry before it."""
    c = core(terms=terms, term=2)
    elect(c)  # term 3
    persist_all(c)
    c.propose(b"x")
    for m in take(c):
        c.step(msg(MsgType.APP_RESP, m.to, "1", term=3, index=c.log.last_index()))
    assert c.log.committed == len(terms) + 2


def test_follower_commit_entry() -> None:
    """§5.3: a follower applies entries the leader says are committed."""
    c = core()
    c.become_follower(1, "2")
    ents = (Entry(1, 1, b"a"), Entry(1, 2, b"b"))
    c.step(msg(MsgType.APP, "2", "1", term=1, index=0, log_term=0, entries=ents, commit=1))
    assert c.log.committed == 1 and [e.data for e in c.log.next_committed()] == [b"a"]


@pytest.mark.parametrize(
    ("term", "index", "reject"),
    [(0, 0, False), (1, 1, False), (2, 2, False), (1, 2, True), (3, 3, True)],
)
def test_follower_check_msg_app(term: int, index: int, reject: bool) -> None:
    """§5.3: a follower refuses entries whose predecessor it does not have."""
    c = core(terms=(1, 2), term=2, commit=1)
    c.become_follower(2, "2")
    c.step(msg(MsgType.APP, "2", "1", term=2, log_term=term, index=index))
    (m,) = take(c)
    assert m.reject is reject
    if reject:
        assert m.index == index


@pytest.mark.parametrize(
    ("index", "term", "ents", "want"),
    [
        (2, 2, [(3, 3)], [(1, 1), (2, 2), (3, 3)]),
        (1, 1, [(2, 3), (3, 4)], [(1, 1), (2, 3), (3, 4)]),
        (0, 0, [(1, 1)], [(1, 1), (2, 2)]),
        (0, 0, [(1, 3)], [(1, 3)]),
    ],
)
def test_follower_append_entries(
    index: int, term: int, ents: list[tuple[int, int]], want: list[tuple[int, int]]
) -> None:
    """§5.3: conflicting entries are deleted and new ones appended."""
    c = core(terms=(1, 2), term=2)
    c.become_follower(2, "2")
    c.step(
        msg(
            MsgType.APP,
            "2",
            "1",
            term=2,
            log_term=term,
            index=index,
            entries=tuple(Entry(t, i, b"x") for i, t in ents),
        )
    )
    assert [(e.index, e.term) for e in c.log.entries] == want


FIG7 = [
    (1, 1, 1, 4, 4, 5, 5, 6, 6, 6),
    (1, 1, 1, 4),
    (1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6),
    (1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7),
    (1, 1, 1, 4, 4, 4, 4),
    (1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3),
]


@pytest.mark.parametrize("follower_terms", FIG7)
def test_leader_sync_follower_log(follower_terms: tuple[int, ...]) -> None:
    """§5.3 figure 7: whatever the follower's log, the leader brings it to match its own."""
    leader_terms = (1, 1, 1, 4, 4, 5, 5, 6, 6, 6)
    lead = core("1", terms=leader_terms, term=8)
    fol = core("2", terms=follower_terms, term=7)
    lead.campaign()
    lead.step(msg(MsgType.VOTE_RESP, "3", "1", term=lead.term))
    assert lead.role is Role.LEADER
    lead.propose(b"payload")
    for _ in range(100):
        moved = False
        for m in take(lead):
            if m.to == "2":
                fol.step(m)
                moved = True
        for m in take(fol):
            lead.step(m)
            moved = True
        if not moved:
            break
    assert [(e.index, e.term) for e in fol.log.entries] == [
        (e.index, e.term) for e in lead.log.entries
    ]


@pytest.mark.parametrize(("terms", "last_term"), [((1,), 1), ((1, 2), 2)])
def test_vote_request(terms: tuple[int, ...], last_term: int) -> None:
    """§5.4.1: vote requests carry the candidate's last log index and term."""
    c = core(terms=terms, term=last_term)
    c.campaign()
    for m in take(c):
        assert (m.index, m.log_term) == (len(terms), last_term)


@pytest.mark.parametrize(
    ("terms", "log_term", "index", "reject"),
    [
        ((1,), 1, 1, False),
        ((1,), 1, 2, False),
        ((1, 1), 1, 1, True),
        ((1,), 2, 1, False),
        ((1,), 2, 2, False),
        ((1, 1), 2, 1, False),
        ((2,), 1, 1, True),
        ((2,), 1, 2, True),
        ((2, 1), 1, 1, True),
    ],
)
def test_voter(terms: tuple[int, ...], log_term: int, index: int, reject: bool) -> None:
    """§5.4.1: votes go only to candidates whose log is at least as up to date."""
    c = core(terms=terms)
    c.step(msg(MsgType.VOTE, "2", "1", term=3, log_term=log_term, index=index))
    (m,) = take(c)
    assert m.reject is reject


@pytest.mark.parametrize(("index", "committed"), [(1, 0), (2, 0), (3, 3)])
def test_leader_only_commits_log_from_current_term(index: int, committed: int) -> None:
    """§5.4.2 (figure 8): entries of earlier terms commit only via one of the current term."""
    c = core(terms=(1, 2), term=2)
    c.campaign()  # term 3
    for v in ("2", "3"):
        c.step(msg(MsgType.VOTE_RESP, v, "1", term=c.term))
    take(c)  # the no-op at index 3 is in flight, unacknowledged
    c.step(msg(MsgType.APP_RESP, "2", "1", term=c.term, index=index))
    assert c.log.committed == committed


def test_ids_fixture_is_three_nodes() -> None:
    assert IDS == ("1", "2", "3")
