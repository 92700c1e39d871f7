"""The direction of dependencies is the architecture: core <- policy <- runtime/http <- app <- cli.

Scans every module's imports with `ast`, so a violation fails here rather than in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# For each layer: the rampmeter packages it may import, and third-party/stdlib modules it must not.
CORE_FORBIDDEN = {"trio", "h11", "h2", "httpx", "time", "random", "os", "socket", "asyncio", "anyio", "threading"}
ALLOWED_PROXY_IMPORTS = {
    "proxy.core": {"proxy.core", "proxy.errors"},
    "proxy.policy": {"proxy.core", "proxy.errors", "proxy.policy"},
    "proxy.http": {"proxy.core", "proxy.errors", "proxy.policy", "proxy.http", "proxy.runtime.metrics"},
    "proxy.runtime": {"proxy.core", "proxy.errors", "proxy.policy", "proxy.http", "proxy.runtime"},
}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


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
    problems = []
    for path in modules(layer):
        for name in imports_of(path):
            if name.startswith("proxy") and not _allowed(name, ALLOWED_PROXY_IMPORTS[layer]):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "\n".join(problems)


def test_client_sdk_imports_nothing_of_the_proxy():
    problems = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules("client_sdk")
        for name in imports_of(path)
        if name.split(".")[0] in {"proxy", "trio", "h2"}
    ]
    assert not problems, "\n".join(problems)
