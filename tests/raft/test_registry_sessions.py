"""Each registry request applies once, however often it reaches the log (issue #15, 8)."""

from __future__ import annotations

import msgspec

from tensorhub.core.registry import (
    SESSION_WINDOW,
    Proposal,
    PublishShard,
    Registry,
    Release,
    Retain,
    encode_proposal,
)


def _prop(seq: int, cmd: object, client: str = "c1") -> bytes:
    return encode_proposal(Proposal(f"{client}#{seq}", cmd, client, seq))  # type: ignore[arg-type]


def _registry_with_v1() -> Registry:
    r = Registry()
    r.apply(1, _prop(1, PublishShard("m", 1, 0, 1, bytes(16), "t")))
    r.apply(2, _prop(2, PublishShard("m", 2, 0, 1, bytes([2]) * 16, "t")))
    return r


def test_a_duplicated_retain_after_a_release_is_not_applied_again() -> None:
    """The history the outside checker found: retain v1, release, the retain's duplicate
    (a client retry on another voter), then a read still showed v1 retained."""
    r = _registry_with_v1()
    retain = _prop(3, Retain("m", 1, "h"))
    r.apply(3, retain)
    r.apply(4, _prop(4, Release("m", 1, "h")))
    req, result = r.apply(5, retain) or ("", None)  # the duplicate reaches the log
    assert req == "c1#3" and result is not None and result.ok  # its first result again
    assert r.version("m", 1).retained == []  # type: ignore[union-attr]


def test_sessions_survive_a_snapshot_and_stay_bounded() -> None:
    r = _registry_with_v1()
    retain = _prop(3, Retain("m", 1, "h"))
    r.apply(3, retain)
    r.apply(4, _prop(4, Release("m", 1, "h")))
    again = Registry.restore(r.snapshot())
    again.apply(5, retain)
    assert again.version("m", 1).retained == []  # type: ignore[union-attr]
    # Past the window, an old request is refused as a duplicate, never applied again.
    idx = 6
    for seq in range(5, 5 + SESSION_WINDOW + 1):
        again.apply(idx, _prop(seq, Release("m", 1, "x")))
        idx += 1
    out = again.apply(idx, retain)
    assert out is not None and out[1].code == "duplicate"
    assert again.version("m", 1).retained == []  # type: ignore[union-attr]
    assert len(again.sessions["c1"].results) == SESSION_WINDOW


def test_unsequenced_proposals_apply_every_time() -> None:
    r = _registry_with_v1()
    raw = encode_proposal(Proposal("x", Retain("m", 1, "h")))
    r.apply(3, raw)
    r.apply(4, encode_proposal(Proposal("y", Release("m", 1, "h"))))
    r.apply(5, raw)
    assert r.version("m", 1).retained == ["h"]  # type: ignore[union-attr]
    assert msgspec.msgpack.decode(r.snapshot())  # sessions encode
