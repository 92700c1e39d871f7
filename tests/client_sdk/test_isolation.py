"""client_sdk depends on nothing in rampmeter and pulls in neither trio nor h2."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import client_sdk

FORBIDDEN = ("proxy", "trio", "h2")


def test_importing_client_sdk_imports_neither_proxy_trio_nor_h2() -> None:
    code = (
        "import sys, client_sdk\n"
        f"loaded = sorted(m for m in {FORBIDDEN!r} if m in sys.modules)\n"
        "assert not loaded, loaded\n"
        "assert client_sdk.Client and client_sdk.AsyncClient\n"
    )
    root = pathlib.Path(client_sdk.__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_no_module_names_a_forbidden_package_in_an_import() -> None:
    offenders = []
    for path in pathlib.Path(client_sdk.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
