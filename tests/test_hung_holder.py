"""A holder in the fetcher's rack hangs (SIGSTOP) mid-fetch while another full holder is
alive (issue #15, break 3): the fetch must move its requests away as soon as gossip
declares the holder dead, not wait out request timeouts against it again and again."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensorhub.io.tensors import tensor_digests
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.weights import llm_like_state_dict

SIZE = 256 << 20
MODEL = "policy"


@pytest.mark.timeout(600)
def test_a_hung_holder_in_our_rack_does_not_starve_the_fetch(tmp_path: Path) -> None:
    specs = [
        Spec("trainer", "dc0/rack0/trainer", voter=True),
        Spec("voter-a", "dc0/rack1/voter-a", voter=True),
        Spec("voter-b", "dc0/rack2/voter-b", voter=True),
        Spec("near", "dc0/rack9/near"),  # the fetcher's rack-mate: its preferred source
        Spec("far", "dc0/rack8/far"),
        Spec("fetcher", "dc0/rack9/fetcher"),
    ]
    with HubProcs(specs, str(tmp_path)) as c:
        c.call(["trainer"], "publish", MODEL, 1, SIZE, 1)
        for holder in ("near", "far"):
            c.call([holder], "prepare", MODEL, 1, None)
            c.call([holder], "fetch", MODEL, 1, None)
            c.call([holder], "result", MODEL, 1, tag="done")
        c.call(["trainer"], "wait_replicated", MODEL, 1, 2)
        assert c.call(["trainer"], "unpublish", MODEL, 1, False) == [[False]]

        c.call(["fetcher"], "prepare", MODEL, 1, None)
        c.call(["fetcher"], "fetch", MODEL, 1, None)
        deadline = time.monotonic() + 60
        while c.call(["fetcher"], "progress", MODEL, 1)[0][0] < 1:
            assert time.monotonic() < deadline, "the fetch made no progress"
            time.sleep(0.001)
        c.pause("near")
        stopped = time.monotonic()
        try:
            ((_t0, _t1, failures, received, _delta),) = c.call(
                ["fetcher"], "result", MODEL, 1, tag="done"
            )
            print(f"fetch done {time.monotonic() - stopped:.1f}s after the stop: {failures}")
            print(f"bytes by source: {received} (near is {c.addr['near']})")
            ((digests,),) = c.call(["fetcher"], "digests", MODEL, 1)
            assert digests == tensor_digests(llm_like_state_dict(SIZE, seed=1))
            # Its requests to the hung holder were reissued when gossip declared it dead,
            # not left to time out (10 s each, and again after every 0.1 s back-off).
            assert failures.get("timed out", 0) == 0, failures
        finally:
            c.resume("near")
