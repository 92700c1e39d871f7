"""Every benchmark module imports: a module moved under proxy/ left three of them (bench.real_habits,
bench.real_habits_litserve, bench.microbatch) failing at their first line, found only when run (stop 28)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import bench

# Server scripts that run in a third-party server's own venv (../shared/servers), not in ours.
OTHER_VENVS = {"bench.microbatch.litserve_embed"}
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(bench.__path__, "bench.")
    if not m.name.startswith("bench.results") and m.name not in OTHER_VENVS
)
MODULES += sorted(f"{m.name}.__main__" for m in pkgutil.walk_packages(bench.__path__, "bench.") if m.ispkg)


@pytest.mark.parametrize("name", MODULES)
def test_the_benchmark_module_imports(name):
    importlib.import_module(name)
