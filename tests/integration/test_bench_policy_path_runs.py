"""bench.policy_path runs against the request path as built (its stand-in upstream answer follows
the pool's Response protocol: a member added there, `all_received`, broke the bench unnoticed)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_policy_path_bench_runs_a_few_requests(tmp_path):
    out = tmp_path / "pp"
    done = subprocess.run(
        [sys.executable, "-m", "bench.policy_path", "--requests", "200", "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["runs"]["requests"] == 200
    assert {t["name"] for t in result["targets"]} >= {"policy_cpu_us_in_process_http1", "policy_cpu_us_in_process_h2c"}
    # Every result says how fast the interpreter that measured it runs Python (bench.common.machine).
    assert result["machine"]["python_step_ns"] > 0
    assert result["machine"]["python_executable"] == sys.executable
    assert "ns a step of bench.common.python_step_ns" in (out / "result.md").read_text()
