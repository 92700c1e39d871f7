"""The front-end e2e test's body, printing its means (run from the worktree root)."""
import sys, json, tempfile, pathlib
import trio
sys.path.insert(0, ".")
from tests.integration.test_real_habits_e2e import engine_policy, loaded_readings
from proxy.testing.stack import sidecar, sim_pod

async def once(spread):
    path = pathlib.Path(tempfile.mkdtemp()) / "policy.toml"
    path.write_text(engine_policy(initial=4, max_limit=16))
    with sim_pod("--max-num-seqs", "4", "--frontend-ms", "60", "--frontend-spread", str(spread), profile="llm", speed=1.0) as pod, sidecar(pod.url(), policy=str(path)) as proxy:
        engine, stats = await loaded_readings(proxy, pod, clients=16, settle_s=5.0, readings=80)
    r = [e["running"] for e in engine]; w = [e["waiting"] for e in engine]
    up = stats["admission"]["upstreams"][0]
    print(json.dumps({"spread": spread, "running": round(sum(r)/len(r), 3), "waiting": round(sum(w)/len(w), 3), "limit": up["limit"], "pass": sum(r)/len(r) >= 3.75 and sum(w)/len(w) <= 3.0 and up["limit"] > 4}), flush=True)

for i in range(int(sys.argv[1])):
    for spread in (0.0, 1.0):
        trio.run(once, spread)
