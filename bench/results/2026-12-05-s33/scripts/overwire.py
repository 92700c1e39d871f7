"""Over the wire: configurations of the server process under unthrottled h2load (10 clients; HTTP/1.1
`--h1 -m1`, h2c `-m10`; stop 32's runs.py), alternated, CPU us a request of the server from /proc.

    python bench/results/2026-12-05-s33/scripts/overwire.py floors [SECONDS] [REPEATS]
        wire (bench.overhead --serve-wire), full (rampmeter serve, bench.overhead's policy), and floors:
        the full sidecar with classify, admit, observe, notes and ready at their floors (stubs.py,
        applied by site/sitecustomize.py through ABLATE): what the rest of the policy path costs.
    python bench/results/2026-12-05-s33/scripts/overwire.py gc [SECONDS] [REPEATS]
        wire and full, each with and without the cyclic collector (HTTP/1.1 only).
Each figure `full - wire` is paired within a repeat; medians, min and max over the repeats.
"""
import os
import sys
import tempfile
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(HERE, "..", "..", "2026-12-05-s32", "scripts"))
import runs  # noqa: E402
from bench.common import Nginx  # noqa: E402
from bench.overhead import BENCH_POLICY  # noqa: E402

FLOORS = "classify admit observe notes ready"


def main() -> None:
    mode = sys.argv[1]
    secs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    policy = Path(tempfile.mkdtemp()) / "p.toml"
    policy.write_text(BENCH_POLICY)
    ng = Nginx(cpu=1)
    wire = [sys.executable, "-m", "bench.overhead", "--serve-wire", "127.0.0.1:0", ng.h1_url]
    serve = [sys.executable, "-m", "proxy", "serve", "--policy", str(policy), "--listen", "127.0.0.1:0",
             "--admin", "127.0.0.1:0", "--upstream", ng.h1_url, "--log-level", "error"]
    if mode == "floors":
        configs = {"wire": (wire, ""), "full": (serve, ""), "floors": (serve, FLOORS)}
        pairs, protos = (("full", "wire"), ("floors", "wire")), ("http1", "h2c")
    else:
        configs = {"wire": (wire, ""), "full": (serve, ""), "wire_nogc": (wire, "nogc"), "full_nogc": (serve, "nogc")}
        pairs, protos = (("full", "wire"), ("full_nogc", "wire_nogc")), ("http1",)
    os.environ["PYTHONPATH"] = os.path.join(HERE, "site")
    rows = []
    try:
        for r in range(reps):
            for proto in protos:
                for name in list(configs) if r % 2 == 0 else list(configs)[::-1]:
                    argv, ablate = configs[name]
                    os.environ["ABLATE"] = ablate
                    runs.record(rows, argv, proto, secs, repeat=r, config=name)
    finally:
        ng.stop()
    for proto in protos:
        pick = lambda c: [x["cpu_us"] for x in rows if x["proto"] == proto and x["config"] == c]  # noqa: E731
        for c, base in pairs:
            print(f"{proto} {base} -> {c}: {runs.pairwise(pick(base), pick(c))}")


if __name__ == "__main__":
    main()
