"""The policy's CPU a request over the wire with two interpreters: the venv's and another venv's
(e.g. one on Debian's PGO-built python3.11). For each repeat, protocol and interpreter, the wire
configuration (bench.overhead --serve-wire) and the full sidecar (bench.overhead's BENCH_POLICY),
alternated; CPU us a request from /proc under unthrottled h2load (10 clients; h1 -m1, h2c -m10).

    python bench/results/2026-12-05-s32/scripts/interp.py OTHER_PYTHON [SECONDS] [REPEATS]
"""
import os, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs  # noqa: E402  (this directory's shared helpers)
from bench.common import Nginx  # noqa: E402
from bench.overhead import BENCH_POLICY


def argv_for(python: str, config: str, ng, policy: Path) -> list[str]:
    if config == "wire":
        return [python, "-m", "bench.overhead", "--serve-wire", "127.0.0.1:0", ng.h1_url]
    return [python, "-m", "proxy", "serve", "--policy", str(policy), "--listen", "127.0.0.1:0",
            "--admin", "127.0.0.1:0", "--upstream", ng.h1_url, "--log-level", "warning"]


def main() -> None:
    other = sys.argv[1]
    secs = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    pythons = {"venv": sys.executable, "other": other}
    policy = Path(tempfile.mkdtemp()) / "p.toml"
    policy.write_text(BENCH_POLICY)
    ng = Nginx(cpu=1)
    rows = []
    try:
        for r in range(reps):
            for proto in ("http1", "h2c"):
                order = list(pythons.items()) if r % 2 == 0 else list(pythons.items())[::-1]
                for name, py in order:
                    for config in ("wire", "full"):
                        runs.record(rows, argv_for(py, config, ng, policy), proto, secs, repeat=r, python=name, config=config)
    finally:
        ng.stop()
    for proto in ("http1", "h2c"):
        for name in pythons:
            pick = lambda c: [x["cpu_us"] for x in rows if x["proto"] == proto and x["python"] == name and x["config"] == c]
            print(f"{proto} {name}: wire -> full (the policy) {runs.pairwise(pick('wire'), pick('full'))}")


if __name__ == "__main__":
    main()
