import sys, time, statistics
from pathlib import Path
sys.path.insert(0, "/work/main")
import httpx
from bench.real_servers.servers import SERVERS, RunningServer, model_name, chat_body
from proxy.testing.stack import sidecar
out = Path("/tmp/s26/passthru")
spec = SERVERS["vllm"]
with RunningServer(spec, out) as server:
    server.install(); server.start()
    model = model_name(spec.url)
    with sidecar([], "--log-level", "warning", policy=str(out / "policy.toml")) as proc:
        time.sleep(3)
        bodies = {"short": chat_body(16, spec.short_tokens, model=model), "long": chat_body(16, spec.long_tokens, model=model)}
        res = {}
        with httpx.Client(timeout=60) as c:
            for i in range(8):
                for shape, body in bodies.items():
                    for name, url in (("direct", spec.url), ("sidecar", proc.url("data"))):
                        t = time.perf_counter()
                        r = c.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
                        res.setdefault((shape, name), []).append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200, r.text
        for k, v in sorted(res.items()):
            print(k, "median %.0f ms" % statistics.median(v), [round(x) for x in v])
