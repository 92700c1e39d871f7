"""Writes grafana-dashboard.json: `python examples/kubernetes/dashboard.py > examples/kubernetes/grafana-dashboard.json`.

The dashboard is generated so every panel states its unit and its queries in one
readable line each, and a test (tests/integration/test_monitoring.py) can check the
committed JSON is current, that every query names a metric rampmeter declares, and
that every query parses (promtool). Latency panels use the histograms (they add up
across pods); the per-pod `rampmeter_pod_latency_quantile_seconds` is left out on
purpose.

Rows: traffic per class (rate, errors, duration: RED), admission, upstream, GPU,
dedup and policy reloads, warm-up.
"""

from __future__ import annotations

import json
import sys

SEL = '{app=~"$app"}'
RATE = "[$__rate_interval]"


def sel(extra: str = "") -> str:
    return '{app=~"$app"' + (f",{extra}" if extra else "") + "}"


ERRORS = sel('code=~"5..|429"')
OK_2XX = sel('code=~"2.."')


def quantile(q: float, metric: str, by: str = "", extra: str = "") -> str:
    group = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel(extra)}{RATE})))"


# (row title, [(panel title, unit, [(legend, expr)], description)]).
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]], str]]]] = [
    (
        "Traffic per class (rate, errors, duration)",
        [
            (
                "Requests by class",
                "reqps",
                [("{{class}}", f"sum by (class) (rate(rampmeter_requests_total{SEL}{RATE}))")],
                "Requests answered, by class (empty: rejected before classification, e.g. a malformed header).",
            ),
            (
                "Errors by class (5xx and 429 share)",
                "percentunit",
                [
                    (
                        "{{class}}",
                        f"sum by (class) (rate(rampmeter_requests_total{ERRORS}{RATE}))"
                        f" / sum by (class) (rate(rampmeter_requests_total{SEL}{RATE}))",
                    )
                ],
                "Share of answers that are 5xx or 429, sidecar rejections included (their reasons: below).",
            ),
            (
                "Request duration p50 / p99 by class",
                "s",
                [
                    ("p99 {{class}}", quantile(0.99, "rampmeter_request_duration_seconds", "class")),
                    ("p50 {{class}}", quantile(0.5, "rampmeter_request_duration_seconds", "class")),
                ],
                "Request head to last response byte, queueing included, over every pod (histogram).",
            ),
            (
                "Goodput vs answered",
                "reqps",
                [
                    ("goodput (2xx within deadline)", f"sum(rate(rampmeter_goodput_total{SEL}{RATE}))"),
                    ("answered", f"sum(rate(rampmeter_requests_total{SEL}{RATE}))"),
                    ("2xx", f"sum(rate(rampmeter_requests_total{OK_2XX}{RATE}))"),
                ],
                "Goodput: answered 2xx before the request's deadline (the SLA).",
            ),
        ],
    ),
    (
        "Admission",
        [
            (
                "Queue depth by class",
                "short",
                [("{{class}}", f"sum by (class) (rampmeter_queue_depth{SEL})")],
                "Requests waiting for admission in the sidecars.",
            ),
            (
                "Queue wait p99 by class",
                "s",
                [("{{class}}", quantile(0.99, "rampmeter_queue_wait_seconds", "class"))],
                "Arrival to admission; the alerts' per-class thresholds apply to this.",
            ),
            (
                "Rejections by class and reason",
                "reqps",
                [("{{class}} {{reason}}", f"sum by (class, reason) (rate(rampmeter_rejections_total{SEL}{RATE}))")],
                "Answers the sidecar made itself (x-rampmeter-reason).",
            ),
            (
                "Concurrency limit and in flight",
                "short",
                [
                    ("limit {{pod}} {{upstream}}", f"sum by (pod, upstream) (rampmeter_admission_limit{SEL})"),
                    ("in flight {{pod}} {{upstream}}", f"sum by (pod, upstream) (rampmeter_admission_inflight{SEL})"),
                ],
                "Per upstream, in the limit's unit (requests or tokens).",
            ),
        ],
    ),
    (
        "Upstream (the model server)",
        [
            (
                "Upstream duration p50 / p99",
                "s",
                [
                    ("p99", quantile(0.99, "rampmeter_upstream_duration_seconds")),
                    ("p50", quantile(0.5, "rampmeter_upstream_duration_seconds")),
                ],
                "First request byte upstream to last response byte: the model's own time (histogram).",
            ),
            (
                "Upstream requests by outcome",
                "reqps",
                [("{{outcome}}", f"sum by (outcome) (rate(rampmeter_upstream_requests_total{SEL}{RATE}))")],
                "ok, errors, timeouts and aborts of upstream exchanges.",
            ),
            (
                "Ready upstreams",
                "short",
                [("{{pod}}", f"sum by (pod) (rampmeter_upstreams_ready{SEL})")],
                "Upstreams that may take traffic (a count); 0 means /readyz answers 503.",
            ),
            (
                "Slow-start factor",
                "percentunit",
                [("{{pod}} {{upstream}}", f"max by (pod, upstream) (rampmeter_slow_start_factor{SEL})")],
                "Share of the admission limit allowed during the warm-up ramp.",
            ),
            (
                "Engine queue (waiting inside the model server)",
                "short",
                [
                    ("waiting {{pod}}", f"max by (pod) (rampmeter_upstream_waiting_requests{SEL})"),
                ],
                "Requests waiting inside the model server (vLLM num_requests_waiting).",
            ),
            (
                "KV-cache usage",
                "percentunit",
                [("{{pod}}", f"max by (pod) (rampmeter_upstream_kv_cache_usage_ratio{SEL})")],
                "Model server KV-cache usage (vLLM gpu_cache_usage_perc).",
            ),
        ],
    ),
    (
        "GPU",
        [
            (
                "GPU memory used",
                "percentunit",
                [
                    (
                        "{{pod}} gpu {{gpu}}",
                        f"max by (pod, gpu) (rampmeter_gpu_memory_used_bytes{SEL} / rampmeter_gpu_memory_total_bytes{SEL})",
                    )
                ],
                "Fraction of GPU memory in use (the gpu_pressure shedding rule reads it).",
            ),
            (
                "GPU utilisation",
                "percentunit",
                [("{{pod}} gpu {{gpu}}", f"max by (pod, gpu) (rampmeter_gpu_utilization_ratio{SEL})")],
                "GPU busy fraction over NVML's sample period.",
            ),
            (
                "GPU power",
                "watt",
                [("{{pod}} gpu {{gpu}}", f"max by (pod, gpu) (rampmeter_gpu_power_watts{SEL})")],
                "GPU power draw.",
            ),
            (
                "GPU temperature",
                "celsius",
                [("{{pod}} gpu {{gpu}}", f"max by (pod, gpu) (rampmeter_gpu_temperature_celsius{SEL})")],
                "GPU core temperature.",
            ),
        ],
    ),
    (
        "Idempotent dedup and policy reloads",
        [
            (
                "Dedup decisions",
                "reqps",
                [("{{decision}}", f"sum by (decision) (rate(rampmeter_dedup_decisions_total{SEL}{RATE}))")],
                "Keyed requests: lead, follow (coalesced), replay, mismatch, conflict, store_down, fail_open.",
            ),
            (
                "Dedup finishes and store errors",
                "reqps",
                [
                    ("{{verdict}}", f"sum by (verdict) (rate(rampmeter_dedup_finishes_total{SEL}{RATE}))"),
                    ("store error {{op}}", f"sum by (op) (rate(rampmeter_dedup_store_errors_total{SEL}{RATE}))"),
                ],
                "Leaders' results, and failed or timed-out store operations (Redis).",
            ),
            (
                "Policy reloads",
                "short",
                [
                    ("{{result}}", f"sum by (result) (increase(rampmeter_policy_reloads_total{SEL}[1h]))"),
                    ("version {{pod}}", f"max by (pod) (rampmeter_policy_version{SEL})"),
                ],
                "Reloads in the last hour by result (error: the previous policy stayed in force), and the version in force.",
            ),
            (
                "Build",
                "short",
                [("{{version}} python {{python}}", f"count by (version, python) (rampmeter_build_info{SEL})")],
                "Pods per rampmeter version (during a rollout, two).",
            ),
        ],
    ),
    (
        "Warm-up",
        [
            (
                "Last warm-up duration",
                "s",
                [("{{pod}}", f"max by (pod) (rampmeter_warmup_duration_seconds{SEL})")],
                "How long the last successful warm-up took (probing to ramping).",
            ),
            (
                "Upstream losses (last hour)",
                "short",
                [("{{pod}} {{cause}}", f"sum by (pod, cause) (increase(rampmeter_upstream_losses_total{SEL}[1h]))")],
                "Ready or probing upstreams lost, by cause; each one means a new warm-up.",
            ),
            (
                "Warm-up probes by outcome",
                "reqps",
                [("{{outcome}}", f"sum by (outcome) (rate(rampmeter_warmup_probes_total{SEL}{RATE}))")],
                "Probes sent by outcome (ok, error, timeout).",
            ),
            (
                "Warm-up probe latency p50 by shape",
                "s",
                [("shape {{shape}}", quantile(0.5, "rampmeter_warmup_probe_duration_seconds", "shape"))],
                "Median probe latency per probe shape (index in [[warmup.probes]]).",
            ),
        ],
    ),
]


def panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], description: str, x: int, y: int) -> dict:
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {
            "defaults": {"unit": unit, **({"decimals": 0} if title == "Ready upstreams" else {})},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard() -> dict:
    panels, pid, y = [], 1, 0
    for row_title, row in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets, description) in enumerate(row):
            panels.append(panel(pid, title, unit, targets, description, 12 * (i % 2), y + 8 * (i // 2)))
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return {
        "title": "rampmeter",
        "uid": "rampmeter",
        "description": "Admission control in front of GPU inference pods (metric names: proxy/metrics.py SPECS; generated by examples/kubernetes/dashboard.py).",
        "tags": ["rampmeter", "inference"],
        "schemaVersion": 39,
        "version": 2,
        "editable": True,
        "time": {"from": "now-3h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                    "current": {},
                },
                {
                    "name": "app",
                    "type": "query",
                    "label": "app",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": {"query": "label_values(rampmeter_requests_total, app)", "refId": "app"},
                    "definition": "label_values(rampmeter_requests_total, app)",
                    "refresh": 2,
                    "current": {},
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
