"""The SDK examples run offline (against their simulated pods) and say what they did."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(script: str) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_quickstart_runs_offline() -> None:
    out = run("sdk_quickstart.py")
    assert "call 0: 200 after 3 attempt(s)" in out
    assert "calls=5" in out


def test_openai_example_runs_offline() -> None:
    out = run("openai_with_rampmeter.py")
    assert out.splitlines() == ["Hello from behind rampmeter.", "attempts=2 retries=1"]
