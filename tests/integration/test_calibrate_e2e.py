"""`rampmeter calibrate` against servers whose figures are known, as a user runs it (a subprocess, real TCP).

Each case checks that the policy it writes passes `rampmeter policy check` as
written and that its figures are within a stated tolerance of the server's
known profile:

- the sim pod's llm profile with --max-num-seqs 8 (continuous batching, stops
  on cancel, exports vLLM's gauges): ms per output token within 25 % of
  (base_ms + per_seq_ms) / speed, chars_per_token within 10 %, the limit exactly
  the engine's 8 (read off its gauges), stops_on_cancel true;
- a serial server that keeps computing: the sim pod's serial profile where it
  exists (admission-real), else tests/integration/standin.py with no /health and
  no /v1: ms per output and prompt token within 15 % / 30 %, the limit 1 or 2
  (a serial engine; 2 when its HTTP front end overlaps), the health path
  discovered (/models for the stand-in), stops_on_cancel false.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.policy.load import load_policy
from proxy.testing.simpod.profiles import PROFILES, get_profile
from proxy.testing.stack import sim_pod
from tests.integration.standin import StandIn

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STOPS = re.compile(r"^#? ?stops_on_cancel = (true|false|\"auto\")", re.M)


def calibrate(url: str, out: Path, *args: str) -> str:
    argv = [sys.executable, "-m", "proxy", "calibrate", url, "--quick", "--kinds", "chat", "-o", str(out), *args]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    check = subprocess.run([sys.executable, "-m", "proxy", "policy", "check", str(out)], capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.strip().endswith(": ok"), check.stderr
    return out.read_text()


def chat_route(policy, prefix):
    return next(r for r in policy.routes if r.path_prefix == prefix)


def test_sim_pod_llm_profile(tmp_path):
    speed = 2.0
    profile = get_profile("llm", speed=speed, max_num_seqs=8)
    with sim_pod("--max-num-seqs", "8", profile="llm", speed=speed) as pod:
        text = calibrate(pod.url(), tmp_path / "llm.toml")
    policy = load_policy(tmp_path / "llm.toml")
    route = chat_route(policy, "/v1/chat/completions")
    per_token = (profile.base_ms + profile.per_seq_ms) / speed
    assert route.ms_per_output_token == pytest.approx(per_token, rel=0.25), text
    assert route.chars_per_token == pytest.approx(profile.chars_per_token, rel=0.1)
    assert route.ms_per_prompt_token <= 5 * profile.prefill_ms_per_token / speed + 0.01
    assert policy.limits.initial_limit == profile.max_num_seqs, text  # the engine's batch, from its gauges
    assert policy.warmup.health_path == "/health"
    assert policy.gpu.upstream_metrics_path == "/metrics"
    assert STOPS.search(text).group(1) == "true", text


@contextlib.contextmanager
def serial_server():
    """(url, known figures) of a serial server that keeps computing: the sim pod's serial profile where this
    sim pod has it, else the stand-in (no /health, no /v1)."""
    if "serial" in PROFILES:  # admission-real's sim-pod habits
        speed = 4.0
        p = get_profile("serial", speed=speed)
        with sim_pod(profile="serial", speed=speed) as pod:
            yield (
                pod.url(),
                {
                    "route": "/v1/chat/completions",
                    "per_output": (p.base_ms + p.per_seq_ms) / speed,
                    "per_prompt": p.prefill_ms_per_token / speed,
                    "health": p.health_path or None,
                },
            )
        return
    with StandIn(
        prefix="", health_path=None, serial=True, base_ms=5, ms_per_prompt_token=0.2, ms_per_output_token=4
    ) as s:
        yield s.url, {"route": "/chat/completions", "per_output": 4.0, "per_prompt": 0.2, "health": "/models"}


def test_serial_server_that_keeps_computing(tmp_path):
    with serial_server() as (url, known):
        text = calibrate(url, tmp_path / "serial.toml")
    policy = load_policy(tmp_path / "serial.toml")
    route = chat_route(policy, known["route"])
    assert route.ms_per_output_token == pytest.approx(known["per_output"], rel=0.15), text
    assert route.ms_per_prompt_token == pytest.approx(known["per_prompt"], rel=0.3), text
    assert policy.limits.initial_limit in (1, 2), text
    if known["health"]:
        assert policy.warmup.health_path == known["health"]
    assert STOPS.search(text).group(1) == "false", text
    # Class budgets leave room for the slowest shape alone: at least two of them for realtime.
    slowest = route.base_ms + 16 * route.ms_per_prompt_token + 128 * route.ms_per_output_token
    assert policy.classes["realtime"].default_timeout_ms >= 2 * slowest
