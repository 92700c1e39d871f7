"""`python -m proxy loadtest` as a real process against the simulated pod and bad targets."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest

from proxy.testing.procs import Proc
from tests.conftest import free_port

pytestmark = pytest.mark.integration

# fixed profile, 8 slots: every request 10 steps of 10 ms -> capacity 8 / 0.1 s = 80 req/s.
POD_ARGS = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "fixed", "--max-num-seqs", "8"]
CAPACITY = 80.0


@pytest.fixture(scope="module")
def pod():
    with Proc(POD_ARGS, name="sim-pod") as proc:
        yield proc


def loadtest(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "loadtest", *args, "--progress", "plain"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_sweep_against_the_pod_finds_a_knee(pod, tmp_path):
    out = loadtest(
        pod.url(),
        "--rate",
        "30,50,110,150",
        "--step-s",
        "3",
        "--warmup-s",
        "0.5",
        "--sla",
        "p99=350ms",
        "--max-lateness-ms",
        "50",
        "--mix",
        "short_chat=3,short_chat_stream=1",
        "--gpu-cost-per-hour",
        "2",
        "--out",
        str(tmp_path),
        "--timeout-ms",
        "5000",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "loadtest.json").read_text())
    loads = {s["load"]: s for s in doc["steps"]}
    assert doc["knee"]["load"] is not None, doc["knee"]["summary"]
    assert 30 <= doc["knee"]["load"] <= CAPACITY and not doc["knee"]["lower_bound"]
    assert loads[150]["within_sla"] is False  # well past capacity, the queue grows without bound
    assert loads[150]["overall"]["achieved_rps"] == pytest.approx(CAPACITY, rel=0.2)
    assert doc["by_shape"]["short_chat_stream"]["ttft_ms"]["count"] > 0
    assert doc["cost"]["usd_per_million_good"] > 0
    assert "Rated capacity" in out.stdout and (tmp_path / "latency.png").stat().st_size > 0
    assert (tmp_path / "report.md").read_text().startswith("# Load test:")
    assert out.stderr.count("step ") >= 4  # plain progress lines


def test_h2c_closed_loop_run(pod, tmp_path):
    out = loadtest(
        pod.url(),
        "--protocol",
        "h2c",
        "--mode",
        "closed",
        "--users",
        "4",
        "--step-s",
        "2",
        "--warmup-s",
        "0.5",
        "--json",
        str(tmp_path / "r.json"),
        "--out",
        str(tmp_path),
        "--no-plots",
        "--idempotency",
        "unique",
        "--sla",
        "p99=1s",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    step = doc["steps"][0]["overall"]
    assert doc["target"]["protocol"] == "h2c" and doc["plan"]["mode"] == "closed"
    # 4 users, ~110 ms a request -> ~36 req/s; loose because the machine is shared.
    assert step["ok"] == step["requests"] > 20 and 15 < step["achieved_rps"] < 45


def test_compare_prints_a_table_and_writes_an_overlay(pod, tmp_path):
    for name, rate in (("a", "20,40"), ("b", "20,40")):
        out = loadtest(
            pod.url(),
            "--rate",
            rate,
            "--step-s",
            "1.5",
            "--warmup-s",
            "0.5",
            "--sla",
            "p99=1s",
            "--out",
            str(tmp_path / name),
            "--no-plots",
            "--name",
            name,
        )
        assert out.returncode == 0, out.stderr
    out = loadtest(
        "compare", str(tmp_path / "a" / "loadtest.json"), str(tmp_path / "b" / "loadtest.json"), "--out", str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0]
    assert "load (req/s)" in header and "| a p99 ms / goodput req/s " in header
    assert header.rstrip().endswith("b p99 ms / goodput req/s")
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    # Without --out nothing is written (not even into the default loadtest-out/).
    quiet = subprocess.run(
        [sys.executable, "-m", "proxy", "loadtest", "compare", "a/loadtest.json", "b/loadtest.json"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=tmp_path,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert "wrote" not in quiet.stdout and not (tmp_path / "loadtest-out").exists()


class _Html(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b"<html><body>hello</body></html>"
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_target_that_returns_html_is_refused_with_a_message(html_server, tmp_path):
    out = loadtest(html_server, "--rate", "5", "--step-s", "1", "--warmup-s", "0", "--out", str(tmp_path))
    assert out.returncode == 2
    assert "not JSON (content-type text/html)" in out.stderr and "<html>" in out.stderr


def test_h2c_against_an_http1_only_server_says_so(html_server, tmp_path):
    out = loadtest(
        html_server, "--protocol", "h2c", "--rate", "5", "--step-s", "1", "--warmup-s", "0", "--out", str(tmp_path)
    )
    assert out.returncode == 2 and "does it speak h2c? try --protocol http1" in out.stderr


def test_unreachable_target(tmp_path):
    out = loadtest(
        f"http://127.0.0.1:{free_port()}", "--rate", "5", "--step-s", "1", "--warmup-s", "0", "--out", str(tmp_path)
    )
    assert out.returncode == 2 and "cannot reach http://127.0.0.1:" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mix", "short_chat,giant_chat"], "unknown shape 'giant_chat'"),
        (["--sla", "p99<1s"], "bad SLA target"),
        (["--mode", "closed"], "--mode closed needs --users"),
        (["--users", "4"], "--users does not apply to --mode open"),
        (["--rate", "0"], "loads must be > 0"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, message, tmp_path):
    argv = ["http://127.0.0.1:1", "--out", str(tmp_path), *args]
    if "--rate" not in args and "--mode" not in args and "--users" not in args:
        argv += ["--rate", "5"]
    out = loadtest(*argv)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_jsonl_files_load(tmp_path):
    from proxy.loadtest.jsonl import load

    path = tmp_path / "work.jsonl"
    path.write_text('{"prompt": "a"}\n{"body": {"input": "b"}, "class": "batch"}\n')
    mix = load(path)
    assert [s.name for s in mix.shapes] == ["completion", "embedding"] and mix.shapes[1].cls == "batch"


def test_malformed_jsonl_names_file_and_line(tmp_path):
    work = tmp_path / "work.jsonl"
    work.write_text('{"prompt": "fine"}\n{"prompt": "oops",}\n')
    out = loadtest("http://127.0.0.1:1", "--rate", "5", "--jsonl", str(work), "--out", str(tmp_path))
    assert out.returncode == 2 and f"{work}:2: invalid JSON" in out.stderr
