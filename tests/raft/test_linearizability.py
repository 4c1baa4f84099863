"""The linearizability checker itself, on histories whose verdict is known."""

from __future__ import annotations

import random

from tensorhub.testing.linearizability import INF, Op, check, latest_register_step


def p(call: float, ret: float, v: int, result: str | None) -> Op:
    return Op(call, ret, "publish", v, result)


def r(call: float, ret: float, result: int) -> Op:
    return Op(call, ret, "read", None, result)


def ok(*ops: Op) -> bool:
    return check(list(ops), 0, latest_register_step)


def test_sequential_history_is_linearizable() -> None:
    assert ok(p(0, 1, 3, "committed"), r(2, 3, 3), p(4, 5, 2, "stale"), r(6, 7, 3))


def test_concurrent_ops_may_take_effect_in_either_order() -> None:
    # A read overlapping a publish may see the old or the new value.
    assert ok(p(0, 10, 5, "committed"), r(1, 2, 0))
    assert ok(p(0, 10, 5, "committed"), r(1, 2, 5))


def test_stale_read_after_acknowledged_write_is_caught() -> None:
    assert not ok(p(0, 1, 5, "committed"), r(2, 3, 0))


def test_reads_going_backwards_are_caught() -> None:
    assert not ok(p(0, 100, 5, "committed"), r(1, 2, 5), r(3, 4, 0))


def test_both_versions_committed_in_the_wrong_order_is_caught() -> None:
    # 7 committed, then (strictly later) 5 also reports committed: impossible.
    assert not ok(p(0, 1, 7, "committed"), p(2, 3, 5, "committed"))
    # ... but overlapping, 5 may have committed first.
    assert ok(p(0, 3, 7, "committed"), p(1, 2, 5, "committed"))


def test_unknown_outcomes_may_or_may_not_have_happened() -> None:
    assert ok(p(0, INF, 9, None), r(1, 2, 0), r(3, 4, 9))
    assert ok(p(0, INF, 9, None), r(1, 2, 0), r(3, 4, 0))
    assert not ok(p(0, INF, 9, None), r(1, 2, 9), r(3, 4, 0))
    assert not ok(r(0, 1, 9))  # nothing could have written 9


def test_stale_rejection_needs_a_newer_commit() -> None:
    assert not ok(p(0, 1, 4, "stale"))
    assert ok(p(0, 1, 6, "committed"), p(2, 3, 4, "stale"))


def test_random_sequential_histories_are_linearizable(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        state, t, ops = 0, 0, []
        for _ in range(rng.randint(1, 25)):
            if rng.random() < 0.5:
                v = rng.randint(1, 30)
                res = "committed" if v > state else "stale"
                state = max(state, v)
                ops.append(p(t, t + 1, v, res))
            else:
                ops.append(r(t, t + 1, state))
            t += 2
        assert ok(*ops)
        # Corrupt one read to a value never current at that time: now it must fail.
        reads = [i for i, o in enumerate(ops) if o.kind == "read"]
        if reads:
            i = rng.choice(reads)
            bad = ops[i]
            ops[i] = r(bad.call, bad.ret, 999)
            assert not ok(*ops)
