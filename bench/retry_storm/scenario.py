"""One run of the retry-storm scenario: a fresh pod (and sidecar), one population, one fault.

Theory of operation: every run starts from nothing, so no run inherits another's
backlog, learned latencies or admission limit: a simulated pod (the "fixed"
profile, whose capacity is computable, `POD`), optionally the rampmeter sidecar
in front of it (bench/policies/retry_storm.toml), waiting for /readyz. Then,
under trio, the population's calls are released open loop at the trace's
intended times (a task per logical request: this is the client side, and the
calls must overlap freely), while one more task posts the fault to the pod
(`POST /sim/faults {"slowdown": 3, "duration_s": ...}`) at its planned time and
notes when the pod took it. After the last arrival every call is allowed to
finish (each is bounded by its own timeouts); then the pod's honest counters
(/sim/stats) and the sidecar's rejections by reason (/metrics) are read, and
both processes stop. The result is a plain dict (JSON-ready) plus the calls.
"""

from __future__ import annotations

import contextlib
import resource
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from bench.common import cpu_seconds
from bench.retry_storm.populations import POPULATIONS, Call, Recorder
from proxy.simpod.profiles import get_profile
from proxy.testing.procs import Proc, wait_for

POLICY = Path(__file__).resolve().parents[1] / "policies" / "retry_storm.toml"


@dataclass(frozen=True)
class PodShape:
    """The simulated pod: every request runs `steps` steps of `step_ms`, `slots` at once."""

    slots: int = 20
    steps: int = 10
    step_ms: float = 20.0

    def args(self) -> list[str]:
        return [
            "--profile",
            "fixed",
            "--max-num-seqs",
            str(self.slots),
            "--fixed-steps",
            str(self.steps),
            "--base-ms",
            f"{self.step_ms:g}",
        ]

    @property
    def capacity_rps(self) -> float:
        profile = get_profile("fixed", max_num_seqs=self.slots, fixed_steps=self.steps, base_ms=self.step_ms)
        return profile.fixed_capacity_rps()

    @property
    def service_s(self) -> float:
        return self.steps * self.step_ms / 1000.0


@dataclass(frozen=True)
class Timeline:
    """Seconds from the trace start: warm-up (not measured), before, during and after the fault."""

    warmup_s: float
    before_s: float
    fault_s: float
    after_s: float
    slowdown: float = 3.0

    @property
    def fault_at(self) -> float:
        return self.warmup_s + self.before_s

    @property
    def fault_end(self) -> float:
        return self.fault_at + self.fault_s

    @property
    def total_s(self) -> float:
        return self.fault_end + self.after_s


@dataclass(frozen=True)
class RunSpec:
    population: str
    sidecar: bool

    @property
    def label(self) -> str:
        return f"{self.population}{'+sidecar' if self.sidecar else ''}"


@contextlib.contextmanager
def processes(spec: RunSpec, pod: PodShape, cpus: dict[str, int | None], policy: Path = POLICY):
    """Yields (url the clients use, pod url, sidecar admin url or None); stops both on exit."""
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", *pod.args()], cpu=cpus["pod"], name="sim-pod") as p:
        if not spec.sidecar:
            yield p.url(), p.url(), None, {"pod": p.popen.pid}
            return
        argv = [
            "serve",
            "--policy",
            str(policy),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            p.url(),
            "--log-level",
            "warning",
        ]
        with Proc(argv, cpu=cpus["sidecar"], name="rampmeter") as rm:
            admin = rm.url("admin")
            wait_for(lambda: _status(admin + "/readyz") == 200, timeout_s=20)
            yield rm.url(), p.url(), admin, {"pod": p.popen.pid, "sidecar": rm.popen.pid}


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.HTTPError:
        return 0


async def _inject(pod_url: str, timeline: Timeline, recorder: Recorder, out: dict) -> None:
    await trio.sleep_until(recorder.t0 + timeline.fault_at)
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
        fault = {"slowdown": timeline.slowdown, "duration_s": timeline.fault_s}
        sent = recorder.now()
        response = await http.post(pod_url + "/sim/faults", json=fault)
        response.raise_for_status()
        out["fault_at"] = (sent + recorder.now()) / 2  # the pod took it between these


async def drive(
    spec: RunSpec, url: str, pod_url: str, offsets, path: str, body: bytes, timeline: Timeline
) -> tuple[list[Call], Recorder, dict]:
    """Release every call at its intended time; returns the calls, attempt times and facts."""
    recorder = Recorder(trio.current_time() + 0.2)
    population = POPULATIONS[spec.population](url, path, body, recorder)
    calls: list[Call] = []
    facts: dict = {"fault_at": None}
    lateness = array("d")  # release time minus intended time, per call: the generator's honesty
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_inject, pod_url, timeline, recorder, facts)
            for offset in offsets:
                await trio.sleep_until(recorder.t0 + offset)
                lateness.append(recorder.now() - offset)
                call = Call(offset)
                calls.append(call)
                nursery.start_soon(population.call, call)
        worst: dict[int, float] = {}  # per second of the trace: the latest release, for finding stalls
        for offset, late in zip(offsets, lateness, strict=False):
            worst[int(offset)] = max(worst.get(int(offset), 0.0), late)
        facts["lateness_max_by_s"] = [round(worst.get(i, 0.0), 4) for i in range(int(timeline.total_s) + 1)]
        ordered = sorted(lateness)
        facts["lateness_p99_s"] = ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
        facts["lateness_max_s"] = ordered[-1] if ordered else 0.0
    finally:
        with trio.CancelScope(shield=True):  # cleanup only
            if hasattr(population, "statistics"):
                facts["client"] = population.statistics()
            await population.aclose()
    return calls, recorder, facts


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_pod(pod_url: str) -> dict:
    stats = httpx.get(pod_url + "/sim/stats", timeout=5.0).json()
    keep = (
        "requests_submitted",
        "requests_executed",
        "requests_completed",
        "requests_cancelled",
        "requests_cancelled_waiting",
        "requests_cancelled_running",
        "busy_s",
        "useful_s",
        "wasted_s",
        "loop_late_steps",
        "loop_lag_s",
    )
    return {k: stats[k] for k in keep}


def read_rejections(admin_url: str | None) -> dict[str, float]:
    if admin_url is None:
        return {}
    text = httpx.get(admin_url + "/metrics", timeout=5.0).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("rejections"):
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    out[sample.labels["reason"]] = sample.value
    return out


def run(
    spec: RunSpec, pod: PodShape, timeline: Timeline, offsets, path: str, body: bytes, cpus: dict[str, int | None]
) -> tuple[list[Call], Recorder, dict]:
    with processes(spec, pod, cpus) as (url, pod_url, admin, pids):
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        before["client"] = _own_cpu_s()
        calls, recorder, facts = trio.run(drive, spec, url, pod_url, offsets, path, body, timeline)
        facts["cpu_s"] = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        facts["cpu_s"]["client"] = _own_cpu_s() - before["client"]
        facts["pod"] = read_pod(pod_url)
        facts["sidecar_rejections"] = read_rejections(admin)
    facts["spec"] = asdict(spec)
    return calls, recorder, facts
