"""`rampmeter calibrate` against servers whose figures are known, as a user runs it (a subprocess, real TCP).

Each case checks that the policy it writes passes `rampmeter policy check` as
written and that its figures are within a stated tolerance of the server's
known profile:

- the sim pod's llm profile with --max-num-seqs 8 (continuous batching, stops
  on cancel, exports vLLM's gauges): ms per output token within 25 % of
  (base_ms + per_seq_ms) / speed, chars_per_token within 10 %, the limit exactly
  the engine's 8 (read off its gauges) following the engine's queue up to 16,
  budgets from the long request with 8 in flight, stops_on_cancel true;
- the sim pod's serial profile (one slot, FIFO, keeps computing) with no /health
  and no /v1: ms per output and prompt token within 15 % / 30 %, the limit 1, the
  health path discovered (/models), stops_on_cancel false (from its gauges);
- the keeps-computing profile (padded batches of 8): ms per output token within
  25 %, the limit 8, stops_on_cancel false;
- a serial stand-in with no gauges (tests/integration/standin.py), so the
  cancel habit is judged by latency: the same figures, the limit 1 or 2.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.policy.load import load_policy
from proxy.simpod.profiles import get_profile
from proxy.testing.stack import sim_pod
from tests.integration.standin import StandIn

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STOPS = re.compile(r"^#? ?stops_on_cancel = (true|false|\"auto\")", re.M)


def calibrate(url: str, out: Path, *args: str) -> str:
    argv = [sys.executable, "-m", "proxy", "calibrate", url, "--quick", "--kinds", "chat", "--max-concurrency", "16"]
    argv += ["-o", str(out), *args]
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
    # Following the engine, bounded at twice the first step where its queue stood (16 users), its gauges
    # read every 1 s.
    assert (policy.limits.kind, policy.limits.max_limit) == ("engine_queue", 32), text
    assert policy.gpu.upstream_metrics_interval_s == 1.0
    # Budgets in turns of the long request with the engine full (each step costs per_seq_ms more per sequence).
    assert "turns of" in text and "the p99 of chat:cancel with 8 in flight" in text, text
    assert policy.warmup.health_path == "/health"
    assert policy.gpu.upstream_metrics_path == "/metrics"
    assert STOPS.search(text).group(1) == "true", text


def test_serial_sim_pod_without_health_or_v1(tmp_path):
    """The serial profile (llama.cpp-style: one slot, FIFO, keeps computing) with no /health and no /v1."""
    speed = 4.0
    p = get_profile("serial", speed=speed)
    with sim_pod("--health-path", "", "--api-prefix", "", profile="serial", speed=speed) as pod:
        text = calibrate(pod.url(), tmp_path / "serial.toml")
    policy = load_policy(tmp_path / "serial.toml")
    route = chat_route(policy, "/chat/completions")
    assert route.ms_per_output_token == pytest.approx((p.base_ms + p.per_seq_ms) / speed, rel=0.15), text
    assert route.ms_per_prompt_token == pytest.approx(p.prefill_ms_per_token / speed, rel=0.3), text
    assert policy.limits.initial_limit == 1, text  # its gauges: one running while others waited
    assert policy.warmup.health_path == "/models"  # discovered after /health ... /v1/models 404
    assert STOPS.search(text).group(1) == "false", text
    # Class budgets leave room for the slowest shape alone: at least two of them for realtime.
    slowest = route.base_ms + 16 * route.ms_per_prompt_token + 128 * route.ms_per_output_token
    assert policy.classes["realtime"].default_timeout_ms >= 2 * slowest


def test_keeps_computing_sim_pod(tmp_path):
    """Padded batches of up to 8 that keep computing after a disconnect (LitServe / PyTriton-style)."""
    speed = 4.0
    p = get_profile("keeps-computing", speed=speed)
    with sim_pod(profile="keeps-computing", speed=speed) as pod:
        text = calibrate(pod.url(), tmp_path / "kc.toml")
    policy = load_policy(tmp_path / "kc.toml")
    route = chat_route(policy, "/v1/chat/completions")
    assert route.ms_per_output_token == pytest.approx((p.base_ms + p.per_seq_ms) / speed, rel=0.25), text
    assert policy.limits.initial_limit == p.max_num_seqs, text
    assert STOPS.search(text).group(1) == "false", text


def test_serial_stand_in_server(tmp_path):
    """The threaded stand-in (tests/integration/standin.py): a serial engine whose HTTP front end is not
    part of the engine, no usage gauges, so the cancel habit is judged by a short request's delay."""
    server = StandIn(
        prefix="", health_path=None, serial=True, base_ms=5, ms_per_prompt_token=0.2, ms_per_output_token=4
    )
    with server:
        text = calibrate(server.url, tmp_path / "standin.toml")
    policy = load_policy(tmp_path / "standin.toml")
    route = chat_route(policy, "/chat/completions")
    assert route.ms_per_output_token == pytest.approx(4.0, rel=0.15), text
    assert route.ms_per_prompt_token == pytest.approx(0.2, rel=0.3), text
    assert policy.limits.initial_limit in (1, 2), text  # 2 when its HTTP front end overlaps the engine
    assert policy.warmup.health_path == "/models"
    assert "next short request +" in text and STOPS.search(text).group(1) == "false", text
