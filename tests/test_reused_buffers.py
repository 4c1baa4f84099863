"""The engine pattern: every version is fetched into the same tensors (issue #15, break 6).

Each fetcher then still held and advertised v1, v2, … all backed by the same memory. v1 was
retained; the trainer, seeing many complete holders at unpublish, kept no copy; the fetchers
overwrote v1 with v2, and a late fetch of v1 failed with ChecksumMismatch: the retained
version was gone. Now a fetch into memory that serves another version withdraws it first
(drained), and only copies that will stay count when deciding who keeps the last one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorhub.io.tensors import tensor_digests
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.weights import llm_like_state_dict

SIZE = 16 << 20
MODEL = "policy"
ENGINES = ["e0", "e1", "e2"]


@pytest.mark.timeout(600)
def test_a_retained_version_survives_engines_reusing_their_buffers(tmp_path: Path) -> None:
    specs = [
        Spec("trainer", "dc0/rack0/trainer", voter=True),
        Spec("voter-a", "dc0/rack1/voter-a", voter=True),
        Spec("voter-b", "dc0/rack2/voter-b", voter=True),
        *(Spec(e, f"dc0/rack3/{e}") for e in ENGINES),
        Spec("late", "dc0/rack4/late"),
    ]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["trainer"], "publish", MODEL, 1, SIZE, 1)
        c.call(["trainer"], "retain", MODEL, 1)
        c.call(ENGINES, "prepare", MODEL, 1, None)
        c.call(ENGINES, "fetch", MODEL, 1, None)
        c.call(ENGINES, "result", MODEL, 1, tag="done")
        c.call(["trainer"], "wait_replicated", MODEL, 1, len(ENGINES))
        c.call(["trainer"], "unpublish", MODEL, 1, True)  # then it scribbles over its buffers
        for v in (2, 3):  # each version into the engines' same tensors
            c.call(["trainer"], "publish", MODEL, v, SIZE, v)
            c.call(ENGINES, "reuse", MODEL, v - 1, v)
            c.call(ENGINES, "fetch", MODEL, v, None)
            c.call(ENGINES, "result", MODEL, v, tag="done")
            want = tensor_digests(llm_like_state_dict(SIZE, seed=v))
            assert all(d == want for (d,) in c.call(ENGINES, "digests", MODEL, v))
            c.call(["trainer"], "wait_replicated", MODEL, v, len(ENGINES))
            c.call(["trainer"], "unpublish", MODEL, v, True)
        # The retained v1 is still readable, bit for bit, by a newcomer.
        c.call(["late"], "prepare", MODEL, 1, None)
        c.call(["late"], "fetch", MODEL, 1, None)
        ((_t0, _t1, failures, _src, _delta),) = c.call(["late"], "result", MODEL, 1, tag="done")
        ((digests,),) = c.call(["late"], "digests", MODEL, 1)
        assert digests == tensor_digests(llm_like_state_dict(SIZE, seed=1)), failures
        assert failures.get("corrupt", 0) == 0, failures  # nobody served overwritten bytes
