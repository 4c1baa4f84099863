"""The Hub across 11 processes: 3 voters and 8 rollouts in two datacenters, three versions
of a 64 MiB mixed-dtype model, with the failures the swarm must survive (issue #5)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensorhub.io.tensors import tensor_digests
from tensorhub.testing.hub_procs import HubProcs, Spec
from tensorhub.testing.weights import llm_like_state_dict

SIZE = 64 << 20
CHUNKS = SIZE // (4 << 20) + 1
MODEL = "policy"
ROLLOUTS = [f"r{i}" for i in range(8)]


def specs() -> list[Spec]:
    out = [
        Spec("trainer", "dc0/rack0/trainer", voter=True),
        Spec("voter-a", "dc0/rack1/voter-a", voter=True),
        Spec("voter-b", "dc1/rack0/voter-b", voter=True),
    ]
    for i, r in enumerate(ROLLOUTS):
        dc = "dc0" if i < 4 else "dc1"
        out.append(Spec(r, f"{dc}/rack{i % 2}/{r}"))
    return out


def expected(version: int) -> dict[str, str]:
    return tensor_digests(llm_like_state_dict(SIZE, seed=version))


def fetch(c: HubProcs, names: list[str], version: int) -> None:
    c.call(names, "prepare", MODEL, version, None)
    c.call(names, "fetch", MODEL, version, None)


def results(c: HubProcs, names: list[str], version: int) -> list[dict[str, int]]:
    """Wait for the fetches; check every fetcher got the version bit for bit."""
    done = c.call(names, "result", MODEL, version, tag="done")
    want = expected(version)
    for n, (d,) in zip(names, c.call(names, "digests", MODEL, version), strict=True):
        assert d == want, f"{n} got different bytes for v{version}"
    return [r[2] for r in done]


def wait_for_progress(c: HubProcs, names: list[str], version: int) -> list[int]:
    """Poll until some fetcher holds a chunk; returns everyone's progress then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = [p for (p,) in c.call(names, "progress", MODEL, version)]
        if max(held) >= 1:
            return held
        time.sleep(0.002)
    raise AssertionError("no fetcher made progress")


@pytest.mark.timeout(600)
def test_three_versions_across_two_datacenters_with_failures(tmp_path: Path) -> None:
    with HubProcs(specs(), str(tmp_path)) as c:
        # v1: the trainer unpublishes while uploads are in flight, then overwrites its
        # buffers. unpublish waits (and, with no other full copy yet, keeps a verified CPU
        # copy); every fetcher still gets v1 exactly.
        assert c.call(["trainer"], "publish", MODEL, 1, SIZE, 1) == [[True]]
        fetch(c, ROLLOUTS, 1)
        wait_for_progress(c, ROLLOUTS, 1)
        (kept,) = c.call(["trainer"], "unpublish", MODEL, 1, True)
        print(f"v1: unpublished mid-fetch, CPU copy kept: {kept[0]}")
        results(c, ROLLOUTS, 1)

        # v2: two rollouts hold it, the trainer lets go; the others fetch from them, and
        # one of the two holders is killed (-9) mid-fetch.
        c.call(["trainer"], "publish", MODEL, 2, SIZE, 2)
        fetch(c, ["r0", "r1"], 2)
        results(c, ["r0", "r1"], 2)
        c.call(["trainer"], "wait_replicated", MODEL, 2, 2)
        assert c.call(["trainer"], "unpublish", MODEL, 2, False) == [[False]]
        rest = ROLLOUTS[2:]
        fetch(c, rest, 2)
        held = wait_for_progress(c, rest, 2)
        c.kill("r0")
        print(f"v2: killed holder r0 with fetchers at {held} of {CHUNKS} chunks")
        assert min(held) < CHUNKS, "every fetch finished before the kill"
        failures = results(c, rest, 2)
        print(f"v2 failures: {failures}")

        # v3: a holder's memory turns corrupt; fetchers detect it, avoid it, and finish.
        c.call(["trainer"], "publish", MODEL, 3, SIZE, 3)
        fetch(c, ["r1", "r2"], 3)
        results(c, ["r1", "r2"], 3)
        c.call(["r1"], "corrupt", MODEL, 3)
        c.call(["trainer"], "wait_replicated", MODEL, 3, 2)
        c.call(["trainer"], "unpublish", MODEL, 3, False)
        rest = ROLLOUTS[3:]
        fetch(c, rest, 3)
        failures = results(c, rest, 3)
        print(f"v3 failures: {failures}")
        assert sum(f.get("corrupt", 0) for f in failures) > 0, "nobody met the corrupt holder"
