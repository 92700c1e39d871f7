"""Deployment files: they parse, agree with each other and with the code, and the image's command runs.

There is no container engine here, so the Dockerfile is checked by reading it and by
running its ENTRYPOINT + CMD argv (the same `rampmeter serve` line) as a real process,
with only the policy path and ports swapped for local ones.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import httpx
import pytest
import yaml
from packaging.requirements import Requirement

from proxy.metrics import PREFIX, SPECS
from proxy.policy.load import load_policy
from proxy.policy.schema import Admin, Listen
from proxy.testing.procs import Proc

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "examples" / "kubernetes"
POLICY = K8S / "policy.toml"


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def load_yaml(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


# --- Dockerfile ---------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile()
    start = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[start:]


def image_argv() -> list[str]:
    stage = dict(final_stage())
    return json.loads(stage["ENTRYPOINT"]) + json.loads(stage["CMD"])


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_dockerfile_slim_base_non_root_exec_form():
    froms = [args for op, args in dockerfile() if op == "FROM"]
    assert froms and all(re.match(r"python:3\.11-slim\b", f) for f in froms)
    users = [args for op, args in final_stage() if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    stage = dict(final_stage())
    assert stage["ENTRYPOINT"].startswith("[") and stage["CMD"].startswith("[")  # exec form: signals reach Python


def test_image_command_is_the_documented_serve_line_with_default_ports():
    argv = image_argv()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] == "rampmeter" and scripts["rampmeter"] == "proxy.cli:main"
    assert argv[1] == "serve"
    assert port_of(option(argv, "--listen")) == port_of(Listen().address) == 8080
    assert option(argv, "--admin") == "0.0.0.0:9090" and port_of(Admin().address) == 9090
    exposed = {int(p) for op, args in final_stage() if op == "EXPOSE" for p in args.split()}
    assert exposed == {8080, 9090}
    assert shlex.join(argv) in (ROOT / "docs" / "deployment.md").read_text()


def test_image_installs_only_what_serve_needs():
    # `pip install rampmeter` is the client SDK alone (pyproject.toml); the image adds the
    # sidecar and Redis (a mounted policy may set dedup.store = "redis"), never plots or the
    # load tester. The wheel step must build the same extras the install step asks for.
    runs = [args for op, args in dockerfile() if op == "RUN"]
    wheel = [r for r in runs if r.startswith("pip wheel")]
    install = [r for r in runs if r.startswith("pip install")]
    assert len(wheel) == 1 and len(install) == 1
    assert "'.[sidecar,redis]'" in wheel[0].split()
    assert "'rampmeter[sidecar,redis]'" in install[0].split() and "--no-index" in install[0].split()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"sidecar", "redis"} <= set(extras)
    image = {Requirement(text).name for text in extras["sidecar"] + extras["redis"]}
    assert not image & {"matplotlib", "rich", "rampmeter"}  # no plots, no load tester, no extra pulling them in


def test_copied_sources_exist_and_are_not_docker_ignored():
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for op, args in dockerfile():
        if op != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for src in sources:
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
            top = PurePosixPath(src).parts[0]
            assert not any(fnmatch(src, pat) or fnmatch(top, pat) for pat in ignored), (
                f"{src} is excluded by .dockerignore"
            )


def test_image_command_help_parses_every_flag():
    argv = image_argv()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *argv[1:], "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--policy", "--listen", "--admin"):
        assert flag in done.stdout


def test_image_command_starts_serves_probes_and_stops_on_sigterm():
    argv = image_argv()[1:]  # `rampmeter` is `python -m proxy` (same entry point, checked above)
    argv[argv.index("--policy") + 1] = str(POLICY)
    argv[argv.index("--listen") + 1] = "127.0.0.1:0"
    argv[argv.index("--admin") + 1] = "127.0.0.1:0"
    with Proc(argv, name="image-cmd") as proc:
        admin = proc.url("admin")
        with httpx.Client(timeout=10, trust_env=False) as client:
            assert client.get(admin + "/healthz").status_code == 200
            assert client.get(admin + "/readyz").status_code in (200, 503)  # the path exists; 503 = not warm
            metrics = client.get(admin + "/metrics")
            assert metrics.status_code == 200 and "rampmeter_" in metrics.text
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout_s=60) == 0, proc.log()


# --- Kubernetes manifests -----------------------------------------------------------


@pytest.fixture(scope="module")
def pod() -> dict:
    (deployment,) = [d for d in load_yaml("deployment.yaml") if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def sidecar(pod) -> dict:
    (container,) = [c for c in pod["initContainers"] if c["name"] == "rampmeter"]
    return container


def named_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    (found,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return found


def test_every_manifest_parses():
    for path in sorted(K8S.glob("*.yaml")):
        assert load_yaml(path.name), path
    assert json.loads((K8S / "grafana-dashboard.json").read_text())["panels"]


def test_rampmeter_is_a_native_sidecar_running_the_image_command(sidecar, pod):
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"] == image_argv()[1:]
    assert "command" not in sidecar  # keeps the image's ENTRYPOINT
    assert any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["containers"])


def test_probes_hit_the_admin_port_and_paths(sidecar):
    admin_port = port_of(option(sidecar["args"], "--admin"))
    assert option(sidecar["args"], "--admin").startswith("0.0.0.0:")  # kubelet probes come from outside the pod
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = sidecar[probe]["httpGet"]
        assert get["path"] == path and named_port(sidecar, get["port"]) == admin_port == 9090, probe
    data_port = port_of(option(sidecar["args"], "--listen"))
    assert named_port(sidecar, "http") == data_port == 8080


def test_the_model_drains_the_sidecar_before_it_stops(pod, sidecar):
    """preStop: POST /admin/drain on the sidecar's admin port, then at least 5 s (endpoint removal)."""
    (model,) = pod["containers"]
    script = model["lifecycle"]["preStop"]["exec"]["command"][-1]
    admin_port = port_of(option(sidecar["args"], "--admin"))
    assert f"http://127.0.0.1:{admin_port}/admin/drain?timeout_s=" in script and 'method="POST"' in script
    compile(script, "preStop", "exec")  # the one-liner is valid Python
    assert "time.sleep(max(0.0, 5 -" in script


def test_grace_period_fits_the_drain_timeout(pod):
    policy = load_policy(POLICY)
    (model,) = pod["containers"]
    script = model["lifecycle"]["preStop"]["exec"]["command"][-1]
    drain_s = float(re.search(r"timeout_s=([0-9.]+)", script).group(1))
    # The hook's drain, the model's own stop (margin), then the sidecar's SIGTERM drain, which after
    # the hook has nothing left but may take listen.drain_timeout_s if the hook timed out.
    assert pod["terminationGracePeriodSeconds"] >= drain_s + policy.listen.drain_timeout_s + 5


def test_policy_comes_from_the_configmap_as_a_directory(sidecar, pod):
    policy_path = PurePosixPath(option(sidecar["args"], "--policy"))
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == str(policy_path.parent)]
    assert "subPath" not in mount  # a subPath mount never sees ConfigMap updates
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (kustomization,) = load_yaml("kustomization.yaml")
    (generator,) = [g for g in kustomization["configMapGenerator"] if g["name"] == volume["configMap"]["name"]]
    files = set(generator["files"])
    assert policy_path.name in files
    policy = load_policy(POLICY)
    for probe in policy.warmup.probes:
        if probe.body_file:
            body = PurePosixPath(probe.body_file)
            assert body.parent == policy_path.parent and body.name in files and (K8S / body.name).is_file()
    assert set(kustomization["resources"]) == {"deployment.yaml", "service.yaml", "networkpolicy.yaml"}
    assert all((K8S / f).is_file() for f in files)


def test_example_policy_agrees_with_the_command_line(sidecar):
    policy = load_policy(POLICY)
    assert policy.listen.address == option(sidecar["args"], "--listen")
    assert policy.admin.address == option(sidecar["args"], "--admin")
    assert policy.upstreams[0].url == "http://127.0.0.1:8000"


def test_service_targets_the_sidecar_data_port_only(sidecar, pod):
    (service,) = load_yaml("service.yaml")
    (deployment,) = load_yaml("deployment.yaml")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    targets = [named_port(sidecar, p["targetPort"]) for p in service["spec"]["ports"]]
    assert targets == [port_of(option(sidecar["args"], "--listen"))]


def test_prometheus_scrapes_the_admin_port_of_the_sidecar(sidecar):
    (config,) = load_yaml("prometheus-scrape.yaml")
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert any(r["regex"] == f"{sidecar['name']};admin" for r in keep)
    assert not any("container_init" in str(r.get("source_labels")) for r in job["relabel_configs"])


# --- metric names in alerts and dashboard -------------------------------------------

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def declared(name: str) -> bool:
    """Whether `name` is a series some SPECS entry exports."""
    by_name = {PREFIX + s.name: s for s in SPECS}
    if name in by_name:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if base != name and base in by_name and by_name[base].buckets is not None:
            return True
    return False


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\brampmeter_[a-z0-9_]+", text))


def rule_exprs() -> dict[str, str]:
    """Alert and recording rule expressions by name."""
    (rules,) = load_yaml("prometheus-rules.yaml")
    return {r.get("alert") or r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def alert_exprs() -> dict[str, str]:
    return {name: expr for name, expr in rule_exprs().items() if ":" not in name}


def dashboard_exprs() -> list[str]:
    dash = json.loads((K8S / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return exprs + [v["definition"] for v in dash["templating"]["list"] if "definition" in v]


def test_alerts_cover_queue_wait_rejections_readiness_and_reloads():
    exprs = rule_exprs()
    assert "histogram_quantile(0.99" in exprs["rampmeter:queue_wait_seconds:p99_5m"]
    assert "rampmeter_queue_wait_seconds_bucket" in exprs["rampmeter:queue_wait_seconds:p99_5m"]
    for klass in ("Realtime", "Interactive", "Batch"):
        assert "rampmeter:queue_wait_seconds:p99_5m" in exprs[f"RampmeterQueueWait{klass}"]
    assert "rampmeter_rejections_total" in exprs["RampmeterRejectionRatioHigh"]
    assert "rampmeter_upstreams_ready" in exprs["RampmeterNotReady"]
    assert 'rampmeter_policy_reloads_total{result="error"}' in exprs["RampmeterPolicyReloadFailed"]


def test_dashboard_covers_the_asked_panels():
    text = " ".join(dashboard_exprs())
    for needed in (
        "rampmeter_queue_depth",
        "rampmeter_queue_wait_seconds_bucket",
        "rampmeter_rejections_total",
        "rampmeter_goodput_total",
        "rampmeter_admission_limit",
        "rampmeter_gpu_memory_used_bytes",
    ):
        assert needed in text, needed


def test_alert_and_dashboard_metric_names_are_declared_in_specs():
    names = set().union(*(metric_names(e) for e in [*rule_exprs().values(), *dashboard_exprs()]))
    assert len(names) >= 15
    missing = sorted(n for n in names if not declared(n))
    assert not missing, f"not in proxy/metrics.py SPECS: {missing}"
