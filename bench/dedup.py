"""Does idempotent dedup hold a client's retries to one GPU execution, and how fast is a replay?

    .venv/bin/python -m bench.dedup [--quick] [--out DIR] [--rounds N] [--repeats N]

Theory of operation. A sim-pod ("fixed" profile, 10 steps x 40 ms: every request
takes SERVICE_S = 0.4 s of engine time) sits behind rampmeter sidecars
(`python -m proxy serve`, slow start off so that admission never queues here).

1. Executions per logical request. WORKERS clients each send logical requests
   one after another; an attempt gives up after half the service time
   (`trio.move_on_after(0.2)`, which closes its connection) and the client
   retries at once with the same Idempotency-Key, up to MAX_ATTEMPTS. Three
   configurations, interleaved round by round, each on fresh keys:
   memory (one sidecar), redis (two sidecars sharing a real redis-server,
   attempts alternating between them: the retry lands on another pod) and off
   (dedup.enabled = false: the header is forwarded and ignored). Executions come
   from the pod's honest `executions_by_idempotency_key` (/sim/stats), engine
   seconds from its useful / wasted (abandoned) accounting. Target: exactly 1.0
   execution per logical request with dedup; without it is reported.
2. Replay latency. Once a request with a key has completed, h2load sends that
   same request (POST, key, body) over one connection, back to back (closed loop:
   no request waits behind another or on an idle wake-up), SAMPLES times a run,
   after a discarded warm-up; latency per request is client-observed on loopback
   (h2load --log-file). memory and redis (replica a) alternate per repeat, over
   HTTP/1.1 and h2c, with a reference in the same rotation: GET /v1/models through
   the memory sidecar, an ordinary proxied answer. A run is void unless every
   sample is a 200 the sidecar counted as a `replay` and the key executed once.
   Targets: median over repeats of p99 <= 2 ms (memory), <= 5 ms (Redis).

Pinning: sidecars on CPU 0; the pod, redis-server, h2load and this process on
CPU 1. `other_busy` is the share of CPU 0 that processes other than the sidecar
used during a replay run: the noise the figures carry on a shared machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import trio

from bench.common import (
    core_busy_seconds,
    cpu_seconds,
    free_port,
    machine,
    parse_args,
    pin,
    require_tool,
    target,
    write_result,
)
from proxy.testing.procs import Proc, wait_for

SERVICE_S, TIMEOUT_S, MAX_ATTEMPTS, WORKERS = 0.4, 0.2, 6, 8
POD_ARGS = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "fixed", "--base-ms", "40"]
BODY = json.dumps({"model": "sim-fixed", "messages": [{"role": "user", "content": "hello"}]}).encode()
HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}
SIDECAR_CPU, OTHER_CPU = 0, 1
TARGET_P99_MS = {"memory": 2.0, "redis": 5.0}
REFERENCE = "reference (GET /v1/models, proxied)"
QUANTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99, "p999_ms": 0.999}


class Redis:
    """redis-server on a free loopback port, no persistence, pinned to OTHER_CPU."""

    def __init__(self) -> None:
        self.port = free_port()
        argv = [
            require_tool("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.proc = subprocess.Popen(["taskset", "-c", str(OTHER_CPU), *argv], stdout=subprocess.DEVNULL)
        ping = ["redis-cli", "-p", str(self.port), "ping"]
        wait_for(lambda: subprocess.run(ping, check=False, capture_output=True).returncode == 0, timeout_s=10)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def sidecar(stack: ExitStack, tmp: Path, pod: Proc, name: str, dedup: dict) -> Proc:
    policy = tmp / f"{name}.toml"
    policy.write_text(
        "[slow_start]\nwindow_s = 0.0\n\n[dedup]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in dedup.items())
    )
    proc = stack.enter_context(
        Proc(
            [
                "serve",
                "--policy",
                str(policy),
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--upstream",
                pod.url(),
                "--log-level",
                "warning",
            ],
            cpu=SIDECAR_CPU,
            name=name,
        )
    )
    wait_for(lambda: httpx.get(proc.url("admin") + "/readyz", timeout=2).status_code == 200, timeout_s=15)
    return proc


def pod_stats(pod: Proc) -> dict:
    return httpx.get(pod.url() + "/sim/stats", timeout=5).json()


def replays(proc: Proc) -> int:
    return httpx.get(proc.url("admin") + "/admin/stats", timeout=5).json()["dedup"]["decisions"]["replay"]


# --- part 1: executions per logical request ---


async def logical(client: httpx.AsyncClient, urls: list[str], key: str) -> dict:
    """One logical request: attempts of TIMEOUT_S each, retried at once with the same key."""
    started, statuses = trio.current_time(), []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        statuses.append("timeout")
        with trio.move_on_after(TIMEOUT_S):
            try:
                resp = await client.post(
                    urls[(attempt - 1) % len(urls)] + "/v1/chat/completions",
                    content=BODY,
                    headers={**HEADERS, "idempotency-key": key},
                )
            except httpx.HTTPError as exc:
                statuses[-1] = type(exc).__name__
                continue
            statuses[-1] = resp.status_code
            if resp.status_code == 200:
                return {"ok": True, "attempts": attempt, "s": trio.current_time() - started, "statuses": statuses}
    return {"ok": False, "attempts": MAX_ATTEMPTS, "s": None, "statuses": statuses}


async def batch(urls: list[str], keys: list[str]) -> list[dict]:
    results: list[dict] = []

    async def worker(mine: list[str]) -> None:
        async with httpx.AsyncClient(timeout=None) as client:
            for key in mine:
                results.append(await logical(client, urls, key))

    async with trio.open_nursery() as nursery:
        for w in range(WORKERS):
            nursery.start_soon(worker, keys[w::WORKERS])
    return results


def run_config(pod: Proc, urls: list[str], name: str, n: int) -> dict:
    keys = [f"{name}-{uuid.uuid4().hex}" for _ in range(n)]
    before = pod_stats(pod)
    results = trio.run(batch, urls, keys)
    wait_for(lambda: (s := pod_stats(pod))["running"] == 0 and s["waiting"] == 0, timeout_s=30)  # leftovers end
    after = pod_stats(pod)
    runs = [after["executions_by_idempotency_key"].get(k, 0) for k in keys]
    done = sorted(r["s"] for r in results if r["ok"])
    statuses: dict[str, int] = {}
    for status in (str(s) for r in results for s in r["statuses"]):
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "logical": n,
        "executions": sum(runs),
        "max_executions_per_key": max(runs),
        "keys_not_once": sum(x != 1 for x in runs),
        "answered": len(done),
        "attempts": sum(r["attempts"] for r in results),
        "answer_s_p50": done[len(done) // 2] if done else None,
        "answer_s_max": done[-1] if done else None,
        "engine_s_useful": after["useful_s"] - before["useful_s"],
        "engine_s_wasted": after["wasted_s"] - before["wasted_s"],
        "statuses": statuses,
    }


# --- part 2: replay latency ---


def h2load(url: str, protocol: str, n: int, key: str | None, log: Path, body: Path) -> list[tuple[int, float]]:
    """n requests over one connection, back to back: the keyed POST, or (key None) GET /v1/models."""
    headers = [f for name, value in {**HEADERS, "idempotency-key": key}.items() for f in ("-H", f"{name}: {value}")]
    request = ["-d", str(body), *headers, url + "/v1/chat/completions"] if key else [url + "/v1/models"]
    argv = [
        "taskset",
        "-c",
        str(OTHER_CPU),
        "h2load",
        *(["--h1"] if protocol == "http1" else []),
        "-c",
        "1",
        "-m",
        "1",
        "-n",
        str(n),
        "--log-file",
        str(log),
        *request,
    ]
    log.unlink(missing_ok=True)  # h2load appends
    out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    rows = [line.split("\t") for line in log.read_text().splitlines() if line] if log.exists() else []
    if not rows:
        raise SystemExit(f"bench: h2load got no answers from {url}: {out.stdout[-600:]} {out.stderr[-300:]}")
    return [(int(r[1]), int(r[2]) / 1000) for r in rows]


def replay_run(proc: Proc, protocol: str, n: int, key: str | None, tmp: Path) -> dict:
    body = tmp / "body.json"
    body.write_bytes(BODY)
    h2load(proc.url(), protocol, max(50, n // 10), key, tmp / "warm.tsv", body)
    before, cpu0, busy0, t0 = (
        replays(proc),
        cpu_seconds(proc.popen.pid),
        core_busy_seconds(SIDECAR_CPU),
        time.monotonic(),
    )
    rows = h2load(proc.url(), protocol, n, key, tmp / "run.tsv", body)
    wall, cpu = time.monotonic() - t0, cpu_seconds(proc.popen.pid) - cpu0
    lat = sorted(ms for _, ms in rows)
    fig = {k: lat[min(len(lat) - 1, int(q * len(lat)))] for k, q in QUANTILES.items()}
    fig.update(
        samples=len(lat),
        max_ms=lat[-1],
        non_200=sum(s != 200 for s, _ in rows),
        replays_counted=replays(proc) - before,
        cpu_us_per_request=1e6 * cpu / len(lat),
        other_busy=max(0.0, core_busy_seconds(SIDECAR_CPU) - busy0 - cpu) / wall,
    )
    if fig["non_200"] or (key is not None and fig["replays_counted"] < len(lat)):
        raise SystemExit(f"bench: not every sample was a 200 replay: {fig}")
    return fig


def prime(pod: Proc, proc: Proc, key: str) -> None:
    headers = {**HEADERS, "idempotency-key": key}
    httpx.post(proc.url() + "/v1/chat/completions", content=BODY, headers=headers, timeout=10).raise_for_status()
    if pod_stats(pod)["executions_by_idempotency_key"].get(key) != 1:
        raise SystemExit("bench: the replay key was not executed exactly once")


# --- summary and the run ---


def summarise(raw: dict[str, list[dict]], replay_raw: dict) -> tuple[dict, dict]:
    execs = {}
    for config, runs in raw.items():
        total = {
            k: sum(r[k] for r in runs)
            for k in (
                "logical",
                "executions",
                "keys_not_once",
                "answered",
                "attempts",
                "engine_s_useful",
                "engine_s_wasted",
            )
        }
        n = total["logical"]
        execs[config] = {
            **total,
            "executions_per_logical": total["executions"] / n,
            "max_executions_per_key": max(r["max_executions_per_key"] for r in runs),
            "answered_ratio": total["answered"] / n,
            "attempts_per_logical": total["attempts"] / n,
        }
    keys = [*QUANTILES, "cpu_us_per_request", "other_busy"]
    replay = {
        s: {
            p: {"samples": sum(r["samples"] for r in runs), **{k: _spread([r[k] for r in runs]) for k in keys}}
            for p, runs in by_proto.items()
        }
        for s, by_proto in replay_raw.items()
    }
    return execs, replay


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def markdown(args, execs: dict, replay: dict, load: dict) -> str:
    lines = [
        f"# bench.dedup ({'quick' if args.quick else 'full'})",
        "",
        (
            f"`{args.command}`: load average before {load['before']}, after {load['after']}; sidecars on CPU "
            f"{SIDECAR_CPU}; pod, redis-server, clients on CPU {OTHER_CPU}."
        ),
        "",
        "## Executions per logical request",
        "",
        (
            f"Service {SERVICE_S * 1000:.0f} ms; client timeout {TIMEOUT_S * 1000:.0f} ms, then an immediate retry "
            f"with the same key, at most {MAX_ATTEMPTS} attempts; {WORKERS} clients. memory: one sidecar; redis: "
            "two sidecars on one redis-server, attempts alternating between them; off: dedup.enabled = false."
        ),
        "",
        (
            "| config | logical | executions / logical | max per key | answered | attempts / logical "
            "| engine s useful | engine s abandoned |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, s in execs.items():
        lines.append(
            f"| {config} | {s['logical']} | {s['executions_per_logical']:.3f} | "
            f"{s['max_executions_per_key']} | {s['answered_ratio']:.0%} | {s['attempts_per_logical']:.2f} | "
            f"{s['engine_s_useful']:.1f} | {s['engine_s_wasted']:.1f} |"
        )
    lines += [
        "",
        "## Replay latency (client-observed, loopback)",
        "",
        (
            "h2load, one connection, requests back to back, replaying one completed key; median over repeats "
            "(p99 min..max). other busy: share of the sidecar's core used by other processes meanwhile."
        ),
        "",
        "| answer | protocol | samples | p50 ms | p90 ms | p99 ms | p99.9 ms | sidecar CPU us/req | other busy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for store, by_proto in replay.items():
        for proto, s in by_proto.items():
            p99 = s["p99_ms"]
            lines.append(
                f"| {store} | {proto} | {s['samples']} | {s['p50_ms']['median']:.2f} | "
                f"{s['p90_ms']['median']:.2f} | {p99['median']:.2f} ({p99['min']:.2f}..{p99['max']:.2f}) | "
                f"{s['p999_ms']['median']:.2f} | {s['cpu_us_per_request']['median']:.0f} | "
                f"{s['other_busy']['median']:.0%} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    def add(p) -> None:
        p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of part 1 (default 3, quick 1)")
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats of part 2 (default 5, quick 1)")

    args = parse_args("dedup", __doc__, add)
    rounds, repeats = args.rounds or (1 if args.quick else 3), args.repeats or (1 if args.quick else 5)
    logical_n, samples = (24, 2000) if args.quick else (64, 5000)
    for tool in ("h2load", "redis-server", "redis-cli", "taskset"):
        require_tool(tool)
    placement = pin(OTHER_CPU)
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rampmeter-bench-dedup-")))
        redis = Redis()
        stack.callback(redis.stop)
        pod = stack.enter_context(Proc(POD_ARGS, cpu=OTHER_CPU, name="sim-pod"))
        on_redis = {"store": "redis", "redis_url": redis.url}
        sidecars = {
            "memory": [sidecar(stack, tmp, pod, "memory", {"store": "memory"})],
            "redis": [sidecar(stack, tmp, pod, f"redis-{x}", on_redis) for x in "ab"],
            "off": [sidecar(stack, tmp, pod, "off", {"enabled": False})],
        }
        raw: dict[str, list[dict]] = {c: [] for c in sidecars}
        for r in range(rounds):
            for config, procs in sidecars.items():
                raw[config].append(fig := run_config(pod, [p.url() for p in procs], config, logical_n))
                print(
                    f"round {r} {config:6s} executions {fig['executions']}/{logical_n} answered {fig['answered']} "
                    f"attempts {fig['attempts']}",
                    flush=True,
                )
        keys = {"memory": f"replay-memory-{uuid.uuid4().hex}", "redis": f"replay-redis-{uuid.uuid4().hex}"}
        for store, key in keys.items():
            prime(pod, sidecars[store][0], key)
        replay_raw: dict = {s: {"http1": [], "h2c": []} for s in (*keys, REFERENCE)}
        for rep in range(repeats):
            for proto in ("http1", "h2c"):
                for store, by_proto in replay_raw.items():
                    fig = replay_run(sidecars.get(store, sidecars["memory"])[0], proto, samples, keys.get(store), tmp)
                    by_proto[proto].append(fig)
                    print(
                        f"replay #{rep} {store:6s} {proto:5s} p50 {fig['p50_ms']:.2f} p99 {fig['p99_ms']:.2f} ms "
                        f"other busy {fig['other_busy']:.0%}",
                        flush=True,
                    )
        if any(pod_stats(pod)["executions_by_idempotency_key"].get(k) != 1 for k in keys.values()):
            raise SystemExit("bench: a replayed key executed more than once")
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    execs, replay = summarise(raw, replay_raw)
    targets = [
        target(f"executions_per_logical_{c}", execs[c]["executions_per_logical"], "==", 1.0)
        for c in ("memory", "redis")
    ]
    targets += [
        target(f"replay_p99_ms_{s}_{p}", replay[s][p]["p99_ms"]["median"], "<=", goal)
        for s, goal in TARGET_P99_MS.items()
        for p in replay[s]
    ]
    layout = {
        "sidecar_cpu": SIDECAR_CPU,
        "other_cpu": OTHER_CPU,
        "this_process": placement,
        "service_s": SERVICE_S,
        "client_timeout_s": TIMEOUT_S,
        "max_attempts": MAX_ATTEMPTS,
        "workers": WORKERS,
        "rounds": rounds,
        "repeats": repeats,
        "replay_samples_per_run": samples,
        "machine": machine(),
    }
    runs = {
        "executions": {"summary": execs, "raw": raw},
        "replay": {"summary": replay, "raw": replay_raw},
        "load_average": load,
        "layout": layout,
    }
    out = write_result(args, runs, targets, markdown(args, execs, replay, load))
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
