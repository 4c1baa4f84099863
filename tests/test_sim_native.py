"""The simulator compiled with mypyc (``sim/native.py``) runs the same runs as the source.

Built here with the network and engine only (about 6 s); the planner joins them in the
full build that ``bench/sim_scale.py --native`` uses (100 s), which checks the same
equality before it times anything. Each run is a fresh process: the compiled modules
must be imported before the source ones."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim import native

ROOT = Path(__file__).resolve().parent.parent
FAST = ("sim/network.py", "sim/engine.py")

_RUN = """
import json, sys
from sim import native
if sys.argv[1] == "native":
    native.enable(tuple(sys.argv[2:]))
import sim.network
from sim.scenario import load
from sim.workloads import run
out = {"compiled": native.is_compiled(sim.network.__file__)}
for kind in ("standalone", "crossdc"):
    sc = load(f"sim/scenarios/{kind}.yaml").replace(strong_baselines=False, rollout_hosts=24)
    out[kind] = run(sc).trace_hash
print(json.dumps(out))
"""


def _run(mode: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != native.ENV}
    p = subprocess.run(
        [sys.executable, "-c", _RUN, mode, *FAST],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    out: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
def test_a_compiled_run_has_the_source_runs_trace_hash() -> None:
    pytest.importorskip("mypyc")
    native.build(FAST)
    compiled, source = _run("native"), _run("source")
    assert compiled.pop("compiled") is True
    assert source.pop("compiled") is False
    assert compiled == source


def test_enabling_after_the_source_was_imported_is_refused() -> None:
    """Mixing would run part of a simulation on each: refuse, naming the module."""
    import sim.network

    if native.is_compiled(sim.network.__file__):
        pytest.skip(f"this process runs the compiled simulator ({native.ENV})")
    with pytest.raises(native.NativeError, match=r"sim\.network was imported from source"):
        native.enable(FAST)


def test_a_build_is_named_by_its_sources() -> None:
    """An edited source must build afresh, never run the old compiled code."""
    assert native.digest(FAST) == native.digest(FAST)
    assert native.digest(FAST) != native.digest(("sim/network.py",))
