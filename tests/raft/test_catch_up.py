"""The leader's flow control after a follower lost messages (issue #15, break 4), pure."""

from __future__ import annotations

from tensorhub.core.raft import RaftConfig, RaftCore
from tensorhub.core.raft.progress import Progress, PState
from tensorhub.core.raft.types import MsgType

from .helpers import PAPER, core, elect, msg, persist_all, take


def _replicating_leader(cfg: RaftConfig) -> tuple[RaftCore, Progress]:
    c = core(cfg=cfg)
    elect(c)
    persist_all(c)
    take(c)
    # Follower 2 acks the no-op: it is replicating now, with a window to fill.
    c.step(msg(MsgType.APP_RESP, "2", "1", term=c.term, index=c.log.last_index()))
    take(c)
    return c, c.progress["2"]


def test_heartbeat_response_frees_a_window_of_lost_appends() -> None:
    cfg = RaftConfig(**{**PAPER.__dict__, "max_inflight": 4, "max_entries_per_msg": 1})
    c, pr = _replicating_leader(cfg)
    assert pr.state is PState.REPLICATE
    for i in range(8):
        c.propose(f"cmd{i}".encode())
    persist_all(c)
    take(c)  # every append to 2 is lost: it was down
    assert pr.is_paused()
    c.step(msg(MsgType.HEARTBEAT_RESP, "2", "1", term=c.term))
    sent = [m for m in take(c) if m.to == "2" and m.type == MsgType.APP]
    assert sent, "a heartbeat response from a paused follower sent nothing"
    # Its answer (a rejection past its log) moves the leader back to probing from there.
    c.step(
        msg(
            MsgType.APP_RESP,
            "2",
            "1",
            term=c.term,
            index=sent[0].index,
            reject=True,
            reject_hint=pr.match,
        )
    )
    assert pr.state is PState.PROBE
    out = [m for m in take(c) if m.to == "2" and m.type == MsgType.APP]
    assert out and out[0].index == pr.match


def test_appends_are_cut_by_bytes() -> None:
    cfg = RaftConfig(**{**PAPER.__dict__, "max_bytes_per_msg": 3000})
    c, pr = _replicating_leader(cfg)
    pr.become_probe()
    pr.probe_sent = True  # paused while ten 1,000-byte commands pile up for it
    for i in range(10):
        c.propose(bytes([i]) * 1000)
    persist_all(c)
    take(c)
    c.step(msg(MsgType.HEARTBEAT_RESP, "2", "1", term=c.term))  # a probe goes out
    (app,) = [m for m in take(c) if m.to == "2" and m.type == MsgType.APP]
    assert len(app.entries) == 3  # 3,000 bytes of the 10,000 waiting
    big, _ = _replicating_leader(cfg)
    big.propose(b"x" * 10_000)  # one entry larger than the limit still goes, alone
    assert any(len(m.entries) == 1 for m in take(big) if m.to == "2" and m.entries)
