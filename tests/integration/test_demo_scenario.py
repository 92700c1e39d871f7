"""The scheduling demo (`proxy.testing.demo_scenario.run_demo`, what `make demo` calls), shortened: it starts
its own pod and sidecars, replays one trace at three targets, prints the table and writes the plot."""

from __future__ import annotations

import pytest

from proxy.testing.demo_scenario import run_demo

pytestmark = pytest.mark.integration


def test_demo_runs_direct_fcfs_and_sjf_side_by_side(tmp_path):
    printed: list[str] = []
    out = run_demo(out_dir=tmp_path, seconds=4.0, capacity_s=3.0, echo=printed.append)
    assert set(out["figures"]) == {"direct", "fcfs", "sjf"}
    assert out["capacity_rps"] > 0 and out["load_rps"] == round(0.9 * out["capacity_rps"], 1)
    for steps in out["figures"].values():
        step = steps[0]
        assert step["short_chat"]["requests"] > 0 and step["long_chat"]["requests"] > 0
        assert step["all"]["ok"] == step["all"]["requests"]  # nothing rejected, failed or timed out
    text = "\n".join(printed)
    for row in ("| direct |", "| rampmeter FCFS |", "| rampmeter SJF+aging |"):
        assert row in text
    assert (tmp_path / "scheduling.png").stat().st_size > 10_000
