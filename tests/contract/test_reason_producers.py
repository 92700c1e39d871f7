"""Each rejection reason has one producer: the module that builds its Reject, as proxy/core/wire.py's
Reason enum names it (issue 16). A second place answering the same reason is a second rule hiding
behind one name; this scan of the product's source finds one."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "proxy"

# reason -> the one module (and function) that builds a Reject or an answer for it
PRODUCERS = {
    "QUEUE_FULL": {("proxy/core/shedding.py", "check")},
    "CLASS_QUEUE_FULL": {("proxy/core/admission.py", "arrive")},
    "DEADLINE_UNMEETABLE": {("proxy/core/shedding.py", "deadline_unmeetable"), ("proxy/core/shedding.py", "")},
    "DEADLINE_EXPIRED": {("proxy/core/decisions.py", "")},
}


@functools.cache
def _trees() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(ROOT.parent)), ast.parse(p.read_text())) for p in sorted(ROOT.rglob("*.py"))]


def _builders(reason: str) -> set[tuple[str, str]]:
    """(file, enclosing function or "" at module level) of every Reject(...) / rejection(...) /
    _reject(...) call whose first argument is Reason.<reason>, or a dict comprehension building them."""
    found = set()
    for rel, tree in _trees():
        for func in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]:
            name = getattr(func, "name", "")
            for node in ast.walk(func):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                first = node.args[0]
                if callee in ("Reject", "rejection", "_reject") and getattr(first, "attr", None) == reason:
                    found.add((rel, name))
    # a call inside a function is also seen from the module level: keep the innermost
    inner = {f for f, n in found if n}
    return {(f, n) for f, n in found if n or f not in inner}


@pytest.mark.parametrize("reason", sorted(PRODUCERS))
def test_each_reason_is_built_in_one_place(reason):
    builders = _builders(reason)
    assert builders, f"nothing builds {reason}"
    assert {f for f, _ in builders} == {f for f, _ in PRODUCERS[reason]}, builders
    assert builders <= PRODUCERS[reason], builders
