"""docs/architecture.md's request path, one line per hop (file:function), names code that exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
HOP = re.compile(r"^\s*\d+\s+(proxy/[\w/]+)\.py:([\w.]+)", re.M)


def test_every_hop_names_a_function_that_exists() -> None:
    hops = HOP.findall(DOC.read_text())
    assert len(hops) >= 25  # the whole path, socket to upstream and back
    missing = []
    for path, qualname in hops:
        obj = importlib.import_module(path.replace("/", "."))
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{path}.py:{qualname}")
                break
    assert not missing, f"docs/architecture.md names code that is not there: {missing}"


def test_every_hop_module_is_held_to_the_typed_hops_rules() -> None:
    """Every module the doc's hops name is under a pyproject.toml mypy override with the typed-hops rules
    (the hops' own, or proxy.core's strict one), so a new untyped def or an Any returned on the path
    fails `make typecheck` (CI)."""
    import fnmatch
    import tomllib

    rules = ("disallow_untyped_defs", "disallow_incomplete_defs", "disallow_untyped_calls", "warn_return_any")
    config = tomllib.loads((DOC.parents[1] / "pyproject.toml").read_text())
    patterns = [
        pattern
        for override in config["tool"]["mypy"]["overrides"]
        if all(override.get(rule) for rule in rules)
        for pattern in override["module"]
    ]
    named = {path.replace("/", ".") for path, _ in HOP.findall(DOC.read_text())}
    loose = {m for m in named if not any(fnmatch.fnmatch(m, p) or m == p for p in patterns)}
    assert not loose, f"hop modules without the typed-hops rules in pyproject.toml: {sorted(loose)}"
