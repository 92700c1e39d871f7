"""`pip install rampmeter` is the SDK alone: client_sdk runs with only its declared dependencies.

Why this way: blocking a few named modules (trio, h2, msgspec) in sys.modules would
not have caught the bug this guards against, an import that is installed in the dev
venv but not declared (anyio was imported and undeclared). So the test builds the
environment a fresh `pip install rampmeter` would have, from the declared metadata:
the base `dependencies` of pyproject.toml, closed over each installed distribution's
own `Requires-Dist` (markers evaluated, no extras), and links only those
distributions' files plus `client_sdk/` (not `proxy/`) into an empty directory. A
subprocess with `python -I -S` (no site-packages, no PYTHONPATH, no cwd) and that
directory alone on sys.path then imports client_sdk and makes real calls, sync and
async. No network (the files come from this venv), so it runs in `make test`; a
fresh venv with `pip install --no-deps` + the declared deps was checked by hand once
(docs/client-sdk.md, "Install").
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import pathlib
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

import client_sdk

ROOT = pathlib.Path(client_sdk.__file__).resolve().parent.parent
SIDECAR_ONLY = ("proxy", "trio", "h2", "msgspec", "prometheus_client", "pynvml", "coredis", "matplotlib", "rich")


def base_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def closure(requirements: list[Requirement]) -> dict[str, md.Distribution]:
    """Every installed distribution a plain install of `requirements` pulls in (name -> dist)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key in seen:
            continue
        dist = md.distribution(req.name)
        seen[key] = dist
        todo += [Requirement(text) for text in dist.requires or ()]
    return seen


def top_level_paths(dist: md.Distribution) -> set[pathlib.Path]:
    """The importable files and packages (and the .dist-info) a distribution installed."""
    out = set()
    for file in dist.files or ():
        first = file.parts[0]
        if first == ".." or first.endswith(".pth") or first == "__pycache__":
            continue  # scripts outside site-packages, path hooks, bytecode
        out.add(pathlib.Path(dist.locate_file(first)))
    return out


@pytest.fixture(scope="module")
def sdk_only_path(tmp_path_factory) -> pathlib.Path:
    """A directory holding only client_sdk and its declared dependency closure."""
    where = tmp_path_factory.mktemp("sdk-only")
    for dist in closure(base_requirements()).values():
        for path in top_level_paths(dist):
            link = where / path.name
            if not link.exists():
                link.symlink_to(path)
    (where / "client_sdk").symlink_to(ROOT / "client_sdk")
    return where


def run_isolated(path: pathlib.Path, code: str) -> subprocess.CompletedProcess:
    prelude = f"import sys\nsys.path[:0] = [{str(path)!r}]\n"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + code],
        cwd=path,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


USE_THE_SDK = f"""
import asyncio, httpx, client_sdk

def answer(request):
    return httpx.Response(200, json={{"ok": True}}, headers={{"x-rampmeter-timeout-hint-ms": "500"}})

with client_sdk.Client("http://pod.test", transport=httpx.MockTransport(answer)) as client:
    assert client.post("/v1/chat/completions", json={{"messages": []}}, deadline_s=2.0).json() == {{"ok": True}}

async def main():
    async with client_sdk.AsyncClient("http://pod.test", transport=httpx.MockTransport(answer)) as client:
        assert (await client.get("/v1/models", deadline_s=1.0)).status_code == 200

asyncio.run(main())
http = httpx.Client(transport=client_sdk.ResilientTransport(httpx.MockTransport(answer)))
assert http.get("http://pod.test/v1/models").status_code == 200
loaded = sorted(m for m in {SIDECAR_ONLY!r} if m in sys.modules)
assert not loaded, loaded
print("sdk ok")
"""


def test_client_sdk_works_with_only_its_declared_dependencies(sdk_only_path) -> None:
    result = run_isolated(sdk_only_path, USE_THE_SDK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "sdk ok"


@pytest.mark.parametrize("module", ["trio", "proxy", "matplotlib"])
def test_the_isolated_environment_really_lacks_the_sidecars_packages(sdk_only_path, module) -> None:
    # The check above means something only if what is not declared cannot be imported there.
    result = run_isolated(sdk_only_path, f"import {module}")
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


def test_every_third_party_import_in_client_sdk_is_a_direct_dependency() -> None:
    # Direct, not merely reachable: anyio arrives with httpx today, but client_sdk imports it
    # itself, so it must not depend on httpx keeping that dependency.
    declared = {r.name.lower().replace("_", "-") for r in base_requirements()}
    providers = md.packages_distributions()
    stdlib = sys.stdlib_module_names
    undeclared = []
    for path in sorted((ROOT / "client_sdk").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in stdlib or top == "client_sdk" or top == "__future__":
                    continue
                dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
                if not dists & declared:
                    undeclared.append(f"{path.name}: {name}")
    assert undeclared == []


def test_client_sdk_ships_py_typed() -> None:
    assert (ROOT / "client_sdk" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["client_sdk"]


def test_the_extras_split_the_sidecar_from_the_sdk() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {Requirement(t).name for t in project["dependencies"]}
    extras = {name: {Requirement(t).name for t in reqs} for name, reqs in project["optional-dependencies"].items()}
    assert base == {"httpx", "tenacity", "anyio"}
    assert {"trio", "h2", "msgspec", "prometheus-client", "nvidia-ml-py"} <= extras["sidecar"]
    assert extras["redis"] == {"coredis"} and extras["plots"] == {"matplotlib"}
    assert "rich" in extras["loadtest"]
    dev = [Requirement(t) for t in project["optional-dependencies"]["dev"]]
    (itself,) = [r for r in dev if r.name == "rampmeter"]
    assert set(itself.extras) == set(extras) - {"dev"}  # [dev] is everything


def test_a_command_whose_extra_is_missing_says_what_to_install(monkeypatch, capsys) -> None:
    # `pip install rampmeter` installs the `rampmeter` script too; without the sidecar extra,
    # `rampmeter serve` must say which extra to install, not die in an import traceback.
    from proxy import cli

    real = cli.importlib.import_module

    def without_sidecar(name: str):
        if name == "proxy.serve":
            raise ModuleNotFoundError("No module named 'trio'", name="trio")
        return real(name)

    monkeypatch.setattr(cli.importlib, "import_module", without_sidecar)
    assert cli.main(["serve", "--policy", "/etc/rampmeter/policy.toml", "--listen", "0.0.0.0:8080"]) == 2
    assert "pip install 'rampmeter[sidecar]'" in capsys.readouterr().err
