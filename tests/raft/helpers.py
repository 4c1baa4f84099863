"""Helpers for driving single RaftCores by hand, as etcd's paper tests do."""

from __future__ import annotations

import random

from tensorhub.core.raft import Entry, HardState, RaftConfig, RaftCore, RaftMessage
from tensorhub.core.raft.types import MsgType

PAPER = RaftConfig(election_tick=10, heartbeat_tick=1, pre_vote=False, check_quorum=False)
IDS = ("1", "2", "3")


def core(
    node: str = "1",
    voters: tuple[str, ...] = IDS,
    terms: tuple[int, ...] = (),
    term: int = 0,
    cfg: RaftConfig = PAPER,
    seed: int = 0,
    vote: str | None = None,
    commit: int = 0,
) -> RaftCore:
    """A core whose log holds one entry per value in ``terms`` (that entry's term)."""
    ents = [Entry(t, i + 1, b"x") for i, t in enumerate(terms)]
    return RaftCore(
        node,
        voters,
        random.Random(seed),
        config=cfg,
        hard_state=HardState(term, vote, commit),
        entries=ents,
    )


def msg(t: MsgType, frm: str, to: str, **kw: object) -> RaftMessage:
    return RaftMessage(t, frm, to, **kw)  # type: ignore[arg-type]


def take(c: RaftCore) -> list[RaftMessage]:
    """Messages the core wants to send (and forget them), as etcd's readMessages."""
    out = list(c.msgs)
    c.msgs.clear()
    return out


def persist_all(c: RaftCore) -> None:
    """Acknowledge every pending Ready (the tests' storage is instantaneous)."""
    while c.has_ready():
        c.advance(c.ready())


def elect(c: RaftCore) -> None:
    """Make ``c`` leader of a fresh term and commit its no-op (etcd's commitNoopEntry)."""
    c.campaign()
    for v in c.voters:
        if v != c.id:
            c.step(msg(MsgType.VOTE_RESP, v, c.id, term=c.term))
    for m in take(c):
        if m.type == MsgType.APP:
            c.step(msg(MsgType.APP_RESP, m.to, c.id, term=c.term, index=m.index + len(m.entries)))
    take(c)
