"""Sidecar CPU per request in front of a vLLM-like pod: what the bench.real_servers runs count.

python /tmp/rc5/cost.py [--rps R] [--duration S] [--admin-poll S] [--pod-args "..."] [--policy FILE] [--idle S] [--upstream URL]
Prints: idle CPU (ms/s) with the bench's pollers, and CPU us/request under an open loop 80/20 mix.
"""
import argparse, json, pathlib, re, statistics, sys, tempfile, time
import httpx, trio
sys.path.insert(0, ".")
from bench.common import cpu_seconds
from proxy import loadtest as lt
from proxy.loadtest.shapes import Shape, chat_body
from proxy.testing.stack import sidecar, sim_pod

p = argparse.ArgumentParser()
p.add_argument("--rps", type=float, default=10.0)
p.add_argument("--duration", type=float, default=20.0)
p.add_argument("--admin-poll", type=float, default=1.0, help="s between /admin/stats reads (0: none)")
p.add_argument("--pod-args", default="--max-num-seqs 8 --frontend-ms 30")
p.add_argument("--policy", default="/work/main/bench/results/2026-12-01-realcal4/run1/vllm.policy.toml")
p.add_argument("--idle", type=float, default=10.0)
p.add_argument("--upstream", default="", help="a running server instead of a sim pod")
p.add_argument("--model", default="tiny")
p.add_argument("--stream", action="store_true")
p.add_argument("--pyspy", default="", help="record a py-spy profile of the sidecar to this file during the load")
p.add_argument("--taskcpu", default="", help="run the sidecar under taskcpu.py, its per-task CPU appended to this file")
a = p.parse_args()

if a.taskcpu:
    import proxy.testing.procs as procs, subprocess as _sp
    _Popen = _sp.Popen
    def _popen(cmd, *args, **kw):
        if list(cmd[1:4]) == ["-m", "proxy", "serve"]:
            cmd = [cmd[0], "/tmp/rc5/taskcpu.py", a.taskcpu, *cmd[3:]]
        return _Popen(cmd, *args, **kw)
    procs.subprocess.Popen = _popen

def mark(pid):
    if a.taskcpu:
        import os, signal
        os.kill(pid, signal.SIGUSR1)


def policy_for(url: str) -> str:
    text = pathlib.Path(a.policy).read_text()
    text = re.sub(r'^url = ".*"$', f'url = "{url}"', text, count=1, flags=re.M)
    text = re.sub(r"\[\[warmup\.probes\]\].*?count = 8\n", "", text, flags=re.S)  # no warm-up probes
    path = pathlib.Path(tempfile.mkdtemp()) / "policy.toml"
    path.write_text(text)
    return str(path)


async def poll_admin(admin: str, every: float) -> None:
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as c:
        while True:
            await c.get(admin + "/admin/stats")
            await trio.sleep(every)


async def measure(proc, url: str) -> dict:
    pid = proc.popen.pid
    admin = proc.url("admin")
    out = {}
    async with trio.open_nursery() as n:
        if a.admin_poll:
            n.start_soon(poll_admin, admin, a.admin_poll)
        mark(pid)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        await trio.sleep(a.idle)
        mark(pid)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        out["idle_cpu_ms_per_s"] = round((c1 - c0) * 1000 / (t1 - t0), 2)
        shapes = (
            Shape("short", "/v1/chat/completions", chat_body(16, 16, model=a.model, stream=a.stream), weight=4, deadline_ms=12000),
            Shape("long", "/v1/chat/completions", chat_body(16, 256, model=a.model, stream=a.stream), weight=1, deadline_ms=12000),
        )
        plan = lt.Plan((lt.Step(a.rps, a.duration, warmup_s=0.0),), mode="open")
        trace = lt.build_trace(plan, lt.Mix(shapes), seed=3)
        target = lt.Target(proc.url("data"), name="through", timeout_s=12.0, max_in_flight=2048, check_json=False)
        spy = None
        if a.pyspy:
            import subprocess
            spy = subprocess.Popen(["/work/wt/realcal5/.venv/bin/py-spy", "record", "-p", str(pid), "-o", a.pyspy, "-f", "raw", "-r", "200", "-d", str(int(a.duration))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c0, t0 = cpu_seconds(pid), time.monotonic()
        result = await lt.run(trace, target)
        c1, t1 = cpu_seconds(pid), time.monotonic()
        mark(pid)
        if spy:
            spy.wait()
        n.cancel_scope.cancel()
    f = result.analyze(lt.SLA()).steps[0].overall
    out |= {"requests": f.requests, "ok": f.ok, "wall_s": round(t1 - t0, 1), "cpu_s": round(c1 - c0, 3),
            "cpu_us_per_request": round((c1 - c0) * 1e6 / max(1, f.requests)),
            "bg_share_us_per_request": round(out["idle_cpu_ms_per_s"] * 1000 * (t1 - t0) / max(1, f.requests))}
    return out


def main():
    if a.upstream:
        with sidecar([], "--log-level", "warning", policy=policy_for(a.upstream)) as proc:
            print(json.dumps(trio.run(measure, proc, a.upstream)), flush=True)
        return
    with sim_pod(*a.pod_args.split(), "--model", a.model, profile="llm", speed=1.0) as pod:
        with sidecar([], "--log-level", "warning", policy=policy_for(pod.url())) as proc:
            print(json.dumps(trio.run(measure, proc, pod.url())), flush=True)

main()
