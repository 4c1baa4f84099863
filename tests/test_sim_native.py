"""The simulator compiled with mypyc (``sim/native.py``) runs the same runs as the source.

Built here with the network and engine only (about 6 s); the planner joins them in the
full build that ``bench/sim_scale.py --native`` uses (100 s), which checks the same
equality before it times anything. Each run is a fresh process: the compiled modules
must be imported before the source ones."""

from __future__ import annotations

import shutil

import pytest

from sim import native

FAST = ("sim/network.py", "sim/engine.py")


@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
def test_a_compiled_run_has_the_source_runs_trace_hash() -> None:
    pytest.importorskip("mypyc")
    native.build(FAST)
    hashes = native.same_runs(FAST, rollouts=24)  # (raises unless they agree)
    assert set(hashes) == {"standalone", "crossdc"}


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
