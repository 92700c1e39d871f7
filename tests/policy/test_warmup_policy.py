"""[warmup], [readiness], [slow_start] and [gpu]: defaults, ranges and cross-field rules."""

from __future__ import annotations

import pytest

from proxy.errors import PolicyError
from proxy.policy.load import parse_policy


def test_defaults_are_a_valid_policy():
    p = parse_policy("")
    assert p.warmup.probes == [] and p.warmup.identity_keys == ["instance_id", "started_at"]
    assert p.readiness.before_warm == "reject" and p.slow_start.window_s == 10.0 and p.gpu.enabled


def test_probes_parse():
    p = parse_policy(
        """
[warmup]
concurrency = 4
success = "count"
min_successes = 2

[[warmup.probes]]
name = "short"
path = "/v1/completions"
body = '{"prompt": "hi", "max_tokens": 8}'
count = 4

[[warmup.probes]]
name = "embed"
method = "POST"
path = "/v1/embeddings"
body_file = "/etc/rampmeter/embed.json"
"""
    )
    assert [pr.name for pr in p.warmup.probes] == ["short", "embed"]
    assert p.warmup.probes[1].count == 8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[warmup.probes]]\nbody = "x"\nbody_file = "y"\n', "warmup.probes[0]: body and body_file are exclusive"),
        (
            "[warmup]\nstable_last_n = 5\n[[warmup.probes]]\ncount = 3\n",
            "warmup.probes[0].count = 3 can never give warmup.stable_last_n = 5",
        ),
        (
            '[warmup]\nsuccess = "count"\nmin_successes = 9\n[[warmup.probes]]\ncount = 3\n',
            "can never give warmup.min_successes = 9",
        ),
        ('[readiness]\nbefore_warm = "wait"\n', "readiness.before_warm"),
        ("[slow_start]\naggression = 0\n", "slow_start.aggression"),
        ("[slow_start]\nmin_weight = 1.5\n", "slow_start.min_weight"),
        ('[[warmup.probes]]\npath = "v1/completions"\n', "warmup.probes[0].path"),
        ('[gpu]\nupstream_metrics_path = "metrics"\n', "gpu.upstream_metrics_path"),
        ("[warmup]\nhealth_interval_s = 0\n", "warmup.health_interval_s"),
        ('[warmup]\nhealth_check = "tcp"\n', "warmup.health_check"),
        ("[warmup]\nhealth_port = 70000\n", "warmup.health_port"),
        ('[warmup]\ngrpc_health_service = "a.B"\n', "warmup.grpc_health_service is only asked by health_check"),
    ],
)
def test_invalid_values_name_the_key(text, message):
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    assert message in str(info.value)


def test_grpc_health_parses():
    w = parse_policy('[warmup]\nhealth_check = "grpc"\ngrpc_health_service = "inference.GRPCInferenceService"\n').warmup
    assert (w.health_check, w.grpc_health_service, w.health_port) == ("grpc", "inference.GRPCInferenceService", 0)
