"""reader.read_once CPU (thread time, loop included), own connection vs httpx, reads `gap` s apart, interleaved."""
import sys, time, trio
sys.path.insert(0, ".")
from proxy.policy.schema import Policy, Upstream
from proxy.policy.warmup import Gpu
from proxy.runtime.probes import new_client
from proxy.runtime.upstream_metrics import UpstreamMetricsReader
n, gap = int(sys.argv[1]), float(sys.argv[2])
pol = Policy(upstreams=[Upstream(url="http://127.0.0.1:18901")], gpu=Gpu(upstream_metrics_path="/metrics"))
async def main():
    reader = UpstreamMetricsReader(pol)
    own = hx = 0.0
    async with new_client(2, None) as client:
        await reader.read_once(None, 0); await reader.read_once(client, 0)
        for _ in range(n):
            await trio.sleep(gap); t = time.thread_time(); await reader.read_once(None, 0); own += time.thread_time() - t
            await trio.sleep(gap); t = time.thread_time(); await reader.read_once(client, 0); hx += time.thread_time() - t
    print(f"gap {gap}s: own connection + hand scan {own/n*1e6:.0f} us, httpx + hand scan {hx/n*1e6:.0f} us per read")
trio.run(main)
