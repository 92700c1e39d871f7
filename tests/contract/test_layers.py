"""The direction of dependencies is the architecture; every package of `proxy` has its row, no exceptions.

    core <- policy <- metrics <- http <- runtime <- app/serve/cli
    core <- loadtest, calibrate (tools that drive or measure a server), simpod (the simulated pod)
    everything <- testing (simulated pod, process helpers, demo: never imported by the product)

Scans every module's imports with `ast`, so a violation fails here rather than in review.
Imports under `if TYPE_CHECKING:` are type-only and not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# For each layer: the rampmeter packages it may import, and third-party/stdlib modules it must not.
CORE_FORBIDDEN = {"trio", "h11", "h2", "httpx", "time", "random", "os", "socket", "asyncio", "anyio", "threading"}
# Leaf modules of the top-level package that everything may use.
LEAVES = {"proxy.errors", "proxy.build"}
PRODUCT = {
    "proxy.core",
    "proxy.policy",
    "proxy.metrics",
    "proxy.http",
    "proxy.runtime",
    "proxy.ready",
    "proxy.logs",
    "proxy.app",
    "proxy.serve",
    "proxy.cli",
    "proxy.loadtest",
    "proxy.calibrate",
    "proxy.simpod",
    *LEAVES,
}
ALLOWED_PROXY_IMPORTS = {
    "proxy.core": {"proxy.core", "proxy.errors"},
    "proxy.policy": {"proxy.core", "proxy.errors", "proxy.policy"},
    "proxy.metrics": {"proxy.core", "proxy.errors"},
    "proxy.http": {"proxy.core", "proxy.errors", "proxy.policy", "proxy.http", "proxy.metrics"},
    "proxy.runtime": {"proxy.core", "proxy.errors", "proxy.policy", "proxy.http", "proxy.runtime", "proxy.metrics"},
    "proxy.loadtest": {"proxy.core", "proxy.errors", "proxy.http", "proxy.loadtest"},
    "proxy.calibrate": {
        "proxy.core",
        "proxy.policy",
        "proxy.http",
        "proxy.runtime",
        "proxy.loadtest",
        "proxy.calibrate",
        *LEAVES,
    },
    "proxy.simpod": {"proxy.core", "proxy.errors", "proxy.policy", "proxy.http", "proxy.ready", "proxy.simpod"},
    "proxy.ready": set(),
    "proxy.logs": set(LEAVES),
    "proxy.app": PRODUCT - {"proxy.serve", "proxy.cli", "proxy.loadtest", "proxy.calibrate", "proxy.simpod"},
    "proxy.serve": PRODUCT - {"proxy.cli", "proxy.loadtest", "proxy.calibrate", "proxy.simpod"},
    "proxy.cli": PRODUCT,
    "proxy.__main__": {"proxy.cli"},
    "proxy.__init__": set(),
    "proxy.testing": {*PRODUCT, "proxy.testing"},
    **{leaf: set() for leaf in LEAVES},
}


def modules(layer: str) -> list[Path]:
    """The files of a package, or the one file of a top-level module (proxy/app.py ...)."""
    base = ROOT / layer.replace(".", "/")
    return sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]


def imports_of(path: Path) -> set[str]:
    """Modules imported at run time (imports under `if TYPE_CHECKING:` are type-only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _allowed(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("path", modules("proxy.core"), ids=lambda p: p.name)
def test_core_is_sans_io(path):
    bad = {n for n in imports_of(path) if n.split(".")[0] in CORE_FORBIDDEN}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}; core takes time and randomness as arguments"


@pytest.mark.parametrize("layer", sorted(ALLOWED_PROXY_IMPORTS))
def test_layers_import_only_downwards(layer):
    allowed = ALLOWED_PROXY_IMPORTS[layer] | {layer}
    problems = []
    for path in modules(layer):
        for name in imports_of(path):
            if name == "proxy":  # `from proxy import x`: judged by what x is
                continue
            if name.startswith("proxy") and not _allowed(name, allowed):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "\n".join(problems)


def test_from_proxy_imports_are_judged_too():
    """`from proxy import loadtest` names a package: it must be one the layer may import."""
    problems = []
    for layer, allowed in ALLOWED_PROXY_IMPORTS.items():
        for path in modules(layer):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "proxy" and node.level == 0:
                    for alias in node.names:
                        name = f"proxy.{alias.name}"
                        if not _allowed(name, allowed | {layer}):
                            problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "\n".join(problems)


def test_every_package_and_module_has_a_layer():
    """A new package or top-level module must be placed in ALLOWED_PROXY_IMPORTS (no silent gaps)."""
    proxy = ROOT / "proxy"
    found = {f"proxy.{p.name}" for p in proxy.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found |= {f"proxy.{p.stem}" for p in proxy.glob("*.py")}
    assert found - set(ALLOWED_PROXY_IMPORTS) == set()


def test_the_product_never_imports_the_test_helpers():
    problems = [
        f"{path.relative_to(ROOT)} imports {name}"
        for layer in ALLOWED_PROXY_IMPORTS
        if layer != "proxy.testing"
        for path in modules(layer)
        for name in imports_of(path)
        if _allowed(name, {"proxy.testing"})
    ]
    assert not problems, "\n".join(problems)


def test_client_sdk_imports_nothing_of_the_proxy():
    problems = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules("client_sdk")
        for name in imports_of(path)
        if name.split(".")[0] in {"proxy", "trio", "h2"}
    ]
    assert not problems, "\n".join(problems)


def test_cli_commands_load_no_test_helper():
    """cli.py imports its subcommands by name (importlib), which the ast scan above cannot see."""
    from proxy.cli import COMMANDS

    assert [module for _, module, *_ in COMMANDS if module.startswith("proxy.testing")] == []
