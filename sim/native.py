"""The simulator's flow network, event loop and chunk planner compiled with mypyc, for
runs at scale.

Why: a 10,240-GPU run spends about a third of its time re-solving max-min rates
(``network.py``) and popping events (``engine.py``) and about a third in the planner's
scans: per-flow and per-chunk Python that a compiler turns into C (68 s from source,
46 s compiled, against #18's 60 s). mypyc compiles the same typed source as is, so a
compiled run is the same run: the same trace hash (``tests/test_sim_native.py``;
``bench/sim_scale.py --native`` checks it before timing). The planner is the node's
own source, compiled for the simulator only: the node always imports it as Python.

Opt-in: set ``TENSORHUB_SIM_NATIVE=1`` (``sim/__init__.py`` then calls :func:`enable`
before any module of the simulator is imported), or pass ``--native`` to
``bench/sim_scale.py``. The build (about 100 s once, mypy analysing what the planner
imports; mypyc comes with mypy, a dev dependency, and needs a C compiler) goes to
``build/sim-native/<digest>/``, never beside the sources: an extension module next to
its ``.py`` shadows it, so an edit to ``network.py`` would silently run the old code.
The digest covers the sources, the Python and the mypy version, so an edited source
builds afresh.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import xxhash

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("sim/network.py", "sim/engine.py", "tensorhub/core/swarm/planner.py")
"""Compiled, as one group: the flow network, the event loop, and the chunk planner every
simulated fetcher runs (a third of a 10,240-GPU run each, about; the rest is spread
thin). The planner is the node's own source, compiled for the simulator only: the node
imports it as Python."""
ENV = "TENSORHUB_SIM_NATIVE"

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(name="sim-native", ext_modules=mypycify(sys.argv[3:], opt_level="3"),
      script_args=["build_ext", "--build-lib", sys.argv[1], "--build-temp", sys.argv[2]])
"""


class NativeError(RuntimeError):
    """The compiled modules cannot be built or used here (no mypyc, no C compiler, or
    the pure modules were imported first)."""


def _name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def digest(modules: tuple[str, ...] = MODULES) -> str:
    """Names a build: the compiled sources, this Python, and the mypy that compiles."""
    h = xxhash.xxh3_64()
    for m in modules:
        h.update(m.encode() + b"\0" + (ROOT / m).read_bytes())
    h.update(sys.version.encode())
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError as e:
        raise NativeError(
            "mypyc is not installed (it comes with mypy: make test installs it)"
        ) from e
    h.update(mypy_version.encode())
    return h.hexdigest()


def build(modules: tuple[str, ...] = MODULES, out_root: Path | None = None) -> Path:
    """The directory holding these modules compiled from this source, built if it is
    not there (about 6 s for the network and engine, 100 s with the planner, whose
    imports mypy analyses too).

    Compiles a copy of the sources in a scratch directory (``build_ext`` writes beside
    what it compiles) and moves the result into place whole, so a build killed halfway
    leaves nothing a later run could take for finished."""
    out = (out_root or ROOT / "build" / "sim-native") / digest(modules)
    if (out / "sim").is_dir() or (out / "tensorhub").is_dir():
        return out
    cc = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        raise NativeError(f"no C compiler ({cc}) to build with")
    with tempfile.TemporaryDirectory(prefix="sim-native-") as tmp:
        stage = Path(tmp) / "src"
        shutil.copytree(ROOT / "tensorhub", stage / "tensorhub")  # (what the planner imports)
        (stage / "sim").mkdir()
        (stage / "sim" / "__init__.py").write_text("")
        for m in modules:
            shutil.copy(ROOT / m, stage / m)
        lib = Path(tmp) / "lib"
        p = subprocess.run(
            [sys.executable, "-c", _SETUP, str(lib), str(Path(tmp) / "tmp"), *modules],
            cwd=stage, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if p.returncode != 0:
            raise NativeError(f"mypyc build failed:\n{(p.stdout + p.stderr)[-3000:]}")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(lib, out)
        except OSError:  # (another process built it meanwhile: theirs is the same)
            if not ((out / "sim").is_dir() or (out / "tensorhub").is_dir()):
                raise
    return out


class _Compiled(importlib.abc.MetaPathFinder):
    """Finds the compiled modules by their full names, ahead of the source: a package's
    ``__path__`` cannot be changed before its ``__init__`` imports them
    (``tensorhub.core.swarm`` imports its planner at once)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        f = self.files.get(name)
        return None if f is None else importlib.util.spec_from_file_location(name, f)


def enable(modules: tuple[str, ...] = MODULES) -> Path:
    """Import ``modules`` compiled in place of their source (building them first if
    needed); the build's directory. Must run before anything imports them."""
    names = [_name(m) for m in modules]
    for name in names:
        mod = sys.modules.get(name)
        if mod is not None and not is_compiled(mod.__file__):
            raise NativeError(f"{name} was imported from source before sim.native.enable()")
    out = build(modules)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    files = {n: out / (m.removesuffix(".py") + suffix) for n, m in zip(names, modules, strict=True)}
    for shared in out.glob(f"*__mypyc{suffix}"):  # mypyc's runtime for the group
        files[shared.name.removesuffix(suffix)] = shared
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise NativeError(f"incomplete build in {out}: {missing}")
    sys.meta_path.insert(0, _Compiled(files))
    return out


def is_compiled(path: str | None) -> bool:
    """Whether a module's file is an extension module (compiled), not source."""
    return path is not None and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


_TRACES = """
import json, sys
from sim import native
if sys.argv[1] == "compiled":
    native.enable(tuple(sys.argv[3:]))
import sim.network
from sim.scenario import load
from sim.workloads import run
out = {"compiled": native.is_compiled(sim.network.__file__)}
for kind in ("standalone", "crossdc"):
    sc = load(f"sim/scenarios/{kind}.yaml").replace(
        strong_baselines=False, rollout_hosts=int(sys.argv[2]))
    out[kind] = run(sc).trace_hash
print(json.dumps(out))
"""


def same_runs(modules: tuple[str, ...] = MODULES, rollouts: int = 48) -> dict[str, str]:
    """The trace hashes of a small standalone and cross-DC run, each run in a fresh
    process compiled and from source; raises unless the two agree (and the compiled one
    was). A compiled figure is only a figure of the same simulation if this holds."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    found = []
    for mode in ("compiled", "source"):
        p = subprocess.run(
            [sys.executable, "-c", _TRACES, mode, str(rollouts), *modules],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if p.returncode != 0:
            raise NativeError(f"the {mode} run failed:\n{(p.stdout + p.stderr)[-3000:]}")
        found.append(json.loads(p.stdout.strip().splitlines()[-1]))
    compiled, source = found
    if compiled.pop("compiled") is not True or source.pop("compiled") is not False:
        raise NativeError(f"{modules} were not compiled in one run and source in the other")
    if compiled != source:
        raise NativeError(f"compiled and source runs differ: {compiled} against {source}")
    return dict(compiled)
