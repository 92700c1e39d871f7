"""Run the simulated GPU inference pod: an OpenAI-compatible server over a vLLM-like engine.

Theory of operation: build a Profile from `--profile` plus any per-field
overrides (every numeric Profile field has a flag, generated from the dataclass
so --help cannot drift from it), a Pod (engine + step loop), the PodAPI handler
and the project's Server (HTTP/1.1 and h2c on one port). Print the ready line
once bound; on SIGTERM/SIGINT drain in-flight requests (`--drain-timeout-s`),
stop the step loop and exit 0.

Example: rampmeter sim-pod --listen 127.0.0.1:0 --profile fixed --speed 10
Real servers' habits: --profile serial (one at a time, keeps computing after a
disconnect), --profile keeps-computing (padded batches), or on any profile
--stops-on-cancel false, --health-path "" (no /health), --api-prefix "" (no /v1),
--batching padded, --max-num-seqs 1, --frontend-ms 60 (time in the HTTP front end, outside the
engine's gauges, as vLLM's CPU build on a busy machine).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from typing import Any

import trio

from proxy.ready import print_ready
from proxy.simpod.faults import Fault, Faults
from proxy.simpod.profiles import OVERRIDABLE, PROFILES, get_profile


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_TYPES: dict[object, Any] = {"float": float, "int": int, "str": str, "bool": _bool}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="address to serve HTTP/1.1 and h2c on (port 0: any free port)",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="llm",
        help="engine cost model (see proxy/simpod/profiles.py)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw (stop lengths, errors)")
    parser.add_argument(
        "--drain-timeout-s", type=float, default=5.0, help="on SIGTERM/SIGINT, how long in-flight requests may finish"
    )
    cold = parser.add_argument_group("cold start")
    cold.add_argument(
        "--cold-start-s", type=float, default=0.0, help="/health (and inference) answer 503 until this long after start"
    )
    cold.add_argument(
        "--cold-penalty",
        type=float,
        default=1.0,
        help="step-time multiplier for the first requests, decaying linearly to 1",
    )
    cold.add_argument(
        "--cold-penalty-requests",
        type=int,
        default=0,
        help="number of executed requests over which the cold penalty decays to 1",
    )
    faults = parser.add_argument_group("faults (one window, in seconds since start; POST /sim/faults at runtime)")
    faults.add_argument("--fault-slowdown", type=float, default=1.0, help="step-time multiplier inside the window")
    faults.add_argument(
        "--fault-error-rate",
        type=float,
        default=0.0,
        help="fraction of requests answered 500 (not executed) inside the window",
    )
    faults.add_argument("--fault-start-s", type=float, default=0.0, help="window start")
    faults.add_argument("--fault-duration-s", type=float, default=math.inf, help="window length (inf: forever)")
    overrides = parser.add_argument_group("profile overrides (default: the profile's value)")
    for f in OVERRIDABLE:
        per_profile = ", ".join(f"{name} {getattr(p, f.name)}" for name, p in PROFILES.items())
        overrides.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=_TYPES[f.type],
            default=argparse.SUPPRESS,
            help=f"{f.metadata['help']} [{per_profile}]",
        )


def build_pod(args: argparse.Namespace):
    from proxy.simpod.driver import Pod

    overrides = {f.name: getattr(args, f.name) for f in OVERRIDABLE if hasattr(args, f.name)}
    profile = get_profile(args.profile, **overrides)
    window = Fault(
        args.fault_slowdown, args.fault_error_rate, args.fault_start_s, args.fault_start_s + args.fault_duration_s
    )
    return Pod(
        profile,
        seed=args.seed,
        cold_start_s=args.cold_start_s,
        cold_penalty=args.cold_penalty,
        cold_penalty_requests=args.cold_penalty_requests,
        faults=Faults([window]),
    )


async def serve(args: argparse.Namespace, pod) -> None:
    from proxy.http.server import Server
    from proxy.policy.schema import Listen
    from proxy.simpod.api import PodAPI

    limits = Listen(address=args.listen, drain_timeout_s=args.drain_timeout_s)
    server = Server(PodAPI(pod), limits=limits, metrics=None, name="sim-pod")
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(pod.run)
            bound = await nursery.start(server.serve, args.listen)
            print_ready({"data": bound})
            async for _ in signals:
                break
            await server.shutdown(args.drain_timeout_s)
            nursery.cancel_scope.cancel()


def run(args: argparse.Namespace) -> int:
    try:
        pod = build_pod(args)
    except ValueError as exc:
        print(f"sim-pod: {exc}", file=sys.stderr)
        return 2
    trio.run(serve, args, pod)
    return 0
