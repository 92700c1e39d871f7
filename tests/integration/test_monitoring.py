"""The monitoring pack (examples/kubernetes): checked by the tools operators run, and against the code.

- promtool: the rules load, the alert fixtures pass (`promtool test rules`), and every
  dashboard query parses as PromQL;
- kubernetes-validate: every manifest validates against the Kubernetes schema;
- the dashboard is what examples/kubernetes/dashboard.py generates, with RED panels per
  class, latency from the histograms, dedup and reload panels, and units that fit;
- every alert has a severity, a runbook in docs/runbooks.md, per-class queue-wait
  thresholds where batch never pages, and a NotReady outside the model's start-up budget;
- the NetworkPolicy lets in only the sidecar's ports, and the Service says h2c.

promtool and kubernetes-validate come from .ci/run (tests.conftest.require_binary: CI fails
loudly without them).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_binary
from tests.integration.test_deploy_files import K8S, ROOT, dashboard_exprs, load_yaml

RUNBOOKS = ROOT / "docs" / "runbooks.md"
MANIFESTS = ("deployment.yaml", "service.yaml", "networkpolicy.yaml")


def run(*argv: str, cwd: Path = K8S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, cwd=cwd)


def alerts() -> list[dict]:
    (rules,) = load_yaml("prometheus-rules.yaml")
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def panels() -> list[dict]:
    return [p for p in json.loads((K8S / "grafana-dashboard.json").read_text())["panels"] if p["type"] != "row"]


# --- promtool -------------------------------------------------------------------------


def test_promtool_checks_the_rules_and_passes_the_fixtures():
    promtool = require_binary("promtool")
    checked = run(promtool, "check", "rules", "prometheus-rules.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run(promtool, "test", "rules", "prometheus-rules.test.yaml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_fixture():
    fixtures = yaml.safe_load((K8S / "prometheus-rules.test.yaml").read_text())
    tested = {t["alertname"] for case in fixtures["tests"] for t in case["alert_rule_test"]}
    untested = {a["alert"] for a in alerts()} - tested
    # Flapping and KV cache are single-expression thresholds on one gauge/counter; the rest is tested.
    assert untested <= {"RampmeterUpstreamFlapping", "RampmeterKvCacheSaturated"}, untested


def test_every_dashboard_query_is_valid_promql(tmp_path):
    promtool = require_binary("promtool")
    queries = [q.replace("$__rate_interval", "5m").replace("$app", ".*") for q in dashboard_exprs()]
    queries = [q for q in queries if not q.startswith("label_values(")]  # a Grafana function, not PromQL
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)]}
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    checked = run(promtool, "check", "rules", str(path))
    assert checked.returncode == 0 and f"{len(queries)} rules found" in checked.stdout, checked.stdout + checked.stderr


# --- kubernetes-validate ----------------------------------------------------------------


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifests_validate_against_kubernetes(name):
    tool = require_binary("kubernetes-validate")
    # 1.29: the first release where native sidecars (restartPolicy on an init container) are on by default.
    done = run(tool, "--strict", "--kubernetes-version", "1.29.0", name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_network_policy_admits_only_the_sidecar_ports():
    (policy,) = load_yaml("networkpolicy.yaml")
    (deployment,) = load_yaml("deployment.yaml")
    pod = deployment["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    sidecar = {p["containerPort"] for c in pod["spec"]["initContainers"] for p in c["ports"]}
    model = {p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert allowed == sidecar == {8080, 9090}
    assert not allowed & model  # the model's own port is closed from outside the pod
    (admin_rule,) = [r for r in policy["spec"]["ingress"] if any(p["port"] == 9090 for p in r["ports"])]
    assert admin_rule["from"]  # the admin port only from where Prometheus runs


def test_service_port_speaks_h2c():
    (service,) = load_yaml("service.yaml")
    (port,) = service["spec"]["ports"]
    assert port["appProtocol"] == "kubernetes.io/h2c"


# --- the dashboard ------------------------------------------------------------------------


def test_dashboard_json_is_generated():
    spec = importlib.util.spec_from_file_location("dashboard", K8S / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (K8S / "grafana-dashboard.json").read_text() == module.render(), (
        "run: python examples/kubernetes/dashboard.py > examples/kubernetes/grafana-dashboard.json"
    )


def by_title() -> dict[str, dict]:
    return {p["title"]: p for p in panels()}


def exprs_of(panel: dict) -> str:
    return " ".join(t["expr"] for t in panel["targets"])


def test_red_panels_per_class_and_latency_from_histograms():
    found = by_title()
    rate, errors, duration = (
        found[t]
        for t in ("Requests by class", "Errors by class (5xx and 429 share)", "Request duration p50 / p99 by class")
    )
    assert "sum by (class)" in exprs_of(rate) and "rampmeter_requests_total" in exprs_of(rate)
    assert 'code=~"5..|429"' in exprs_of(errors) and "sum by (class)" in exprs_of(errors)
    assert "rampmeter_request_duration_seconds_bucket" in exprs_of(duration) and "by (class, le)" in exprs_of(duration)
    assert "rampmeter_upstream_duration_seconds_bucket" in exprs_of(found["Upstream duration p50 / p99"])
    everything = " ".join(exprs_of(p) for p in panels())
    for needed in ("rampmeter_dedup_decisions_total", "rampmeter_policy_reloads_total", "rampmeter_rejections_total"):
        assert needed in everything, needed
    assert "pod_latency_quantile" not in everything  # per-pod quantiles do not aggregate


def test_units_fit_what_is_shown():
    for panel in panels():
        unit, text = panel["fieldConfig"]["defaults"]["unit"], exprs_of(panel)
        if "histogram_quantile" in text and "_seconds_bucket" in text:
            assert unit == "s", panel["title"]
        if unit == "percentunit":  # a ratio: a *_ratio metric, the slow-start factor, or a division
            assert re.search(r"_ratio\b|slow_start_factor| / ", text), panel["title"]
    found = by_title()
    assert found["Ready upstreams"]["fieldConfig"]["defaults"] == {"unit": "short", "decimals": 0}
    assert found["GPU power"]["fieldConfig"]["defaults"]["unit"] == "watt"
    assert "/ 1000" not in exprs_of(found["GPU power"])
    assert found["Requests by class"]["fieldConfig"]["defaults"]["unit"] == "reqps"


def test_panels_do_not_overlap():
    cells = set()
    for panel in json.loads((K8S / "grafana-dashboard.json").read_text())["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine


# --- alerts -------------------------------------------------------------------------------


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", markdown, re.M)
    }


def test_every_alert_has_a_severity_and_a_runbook_that_exists():
    documented = anchors(RUNBOOKS.read_text())
    for alert in alerts():
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        url = alert["annotations"]["runbook_url"]
        assert url.startswith("https://") and "/docs/runbooks.md#" in url, alert["alert"]
        assert url.rsplit("#", 1)[1] in documented, f"{alert['alert']}: no heading for {url} in docs/runbooks.md"


def threshold(expr: str) -> float:
    return float(re.search(r">\s*([0-9.]+)\s*$", expr.strip())[1])


def test_queue_wait_thresholds_per_class_and_batch_never_pages():
    found = {a["alert"]: a for a in alerts()}
    waits = [found[f"RampmeterQueueWait{k}"] for k in ("Realtime", "Interactive", "Batch")]
    assert [threshold(a["expr"]) for a in waits] == sorted(threshold(a["expr"]) for a in waits)
    assert len({threshold(a["expr"]) for a in waits}) == 3
    assert found["RampmeterQueueWaitBatch"]["labels"]["severity"] == "info"
    assert all('class="batch"' not in a["expr"] or a["labels"]["severity"] != "critical" for a in alerts())
    assert 'class!="batch"' in found["RampmeterRejectionRatioHigh"]["expr"]


def seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_not_ready_pages_only_past_the_model_start_up_budget():
    (deployment,) = load_yaml("deployment.yaml")
    (model,) = deployment["spec"]["template"]["spec"]["containers"]
    probe = model["startupProbe"]
    budget_s = probe["periodSeconds"] * probe["failureThreshold"]
    assert budget_s == 15 * 60
    (alert,) = [a for a in alerts() if a["alert"] == "RampmeterNotReady"]
    assert alert["labels"]["severity"] == "critical" and seconds(alert["for"]) > budget_s
