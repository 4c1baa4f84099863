"""tensorhub/core must stay pure: no I/O, no clock, no global randomness, no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "tensorhub" / "core"
BANNED = {
    "asyncio",
    "socket",
    "time",
    "random",
    "torch",
    "uvloop",
    "datetime",
    "selectors",
    "threading",
    "subprocess",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


FILES = sorted(CORE.rglob("*.py"))


def test_core_has_modules() -> None:
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_nothing_impure(path: Path) -> None:
    bad = _imports(path) & BANNED
    assert not bad, f"{path} imports {sorted(bad)}"


def test_checker_catches_a_banned_import(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import os\nfrom time import monotonic\nimport torch.nn as nn\n")
    assert _imports(p) & BANNED == {"time", "torch"}
