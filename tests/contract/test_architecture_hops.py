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
