"""A Wing–Gong linearizability checker with memoization (as in Lowe's and Porcupine's).

A history is a list of :class:`Op` s with invocation and response times. An op whose
outcome is unknown (the client timed out) has ``ret = inf`` and may or may not have taken
effect. The history is linearizable if some total order of the ops (all known ops and any
subset of unknown ones) respects real time (an op that returned before another was invoked
comes first) and replays correctly against the sequential model. Check each model key
separately (P-compositionality) to keep histories small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

INF = math.inf


@dataclass(frozen=True)
class Op:
    call: float
    ret: float  # INF: outcome unknown
    kind: str
    arg: Any
    result: Any


StepFn = Callable[[Hashable, Op], "tuple[bool, Hashable]"]


def check(ops: Sequence[Op], init: Hashable, step: StepFn) -> bool:
    """True if ``ops`` is linearizable against the model ``(init, step)``."""
    n = len(ops)
    known = 0
    for i, op in enumerate(ops):
        if op.ret != INF:
            known |= 1 << i
    seen: set[tuple[int, Hashable]] = set()
    stack: list[tuple[int, Hashable]] = [(0, init)]
    while stack:
        done, state = stack.pop()
        if done & known == known:
            return True
        if (done, state) in seen:
            continue
        seen.add((done, state))
        pending = [i for i in range(n) if not done >> i & 1]
        horizon = min((ops[i].ret for i in pending), default=INF)
        for i in pending:
            if ops[i].call > horizon:
                continue  # some pending op returned before this one was invoked
            ok, nxt = step(state, ops[i])
            if ok:
                stack.append((done | 1 << i, nxt))
    return False


def latest_register_step(state: Hashable, op: Op) -> tuple[bool, Hashable]:
    """The registry model per model: ``latest`` committed version.

    ``publish(v)`` returns "committed" iff v > latest (then latest = v), "stale" iff not;
    ``read()`` returns latest.
    """
    assert isinstance(state, int)
    if op.kind == "read":
        return op.result == state, state
    if op.kind == "publish":
        v = op.arg
        if op.result == "committed":
            return v > state, v
        if op.result == "stale":
            return v <= state, state
        if op.result is None:  # unknown outcome: it either committed here or did not happen
            return v > state, v
    raise ValueError(f"unknown op {op}")
