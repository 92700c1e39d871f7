"""The load generator's arithmetic is pure: no clock, no sockets, no event loop, no global randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "proxy" / "loadtest"
PURE = ["arrivals", "shapes", "jsonl", "trace", "records", "stats", "verdict", "analysis", "markdown", "report"]
FORBIDDEN = {"trio", "h11", "h2", "httpx", "time", "os", "socket", "asyncio", "threading", "matplotlib", "rich"}


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_io(module):
    names = imported(ROOT / f"{module}.py")
    bad = {n for n in names if n.split(".")[0] in FORBIDDEN}
    bad |= {n for n in names if n.startswith("proxy.loadtest.") and n.rsplit(".", 1)[1] not in PURE}
    assert not bad, f"proxy/loadtest/{module}.py imports {sorted(bad)}"


@pytest.mark.parametrize("module", PURE)
def test_randomness_is_never_module_state(module):
    # random.Random instances (seeded or injected) only: no random.random(), random.choice(), ...
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert not [c for c in calls if c.startswith("random.") and c != "random.Random"]
