"""Probe a running model server and write a commented policy for it (rampmeter calibrate URL).

What it measures, in this order (a few seconds to a minute): which health path
answers; which OpenAI-style routes exist (chat, completions, embeddings, with or
without /v1) plus any --request you name; each request shape's service time
alone; the concurrency knee (closed-loop steps of the load generator until
throughput is flat); whether dropping a request's connection stops its work; and
whether /metrics exports the engine's queue. The policy it writes comments every
value with the figure it came from, and is checked before it is written.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

import trio

from proxy.calibrate import shapes as cs
from proxy.calibrate.measure import CalibrationError, Options, calibrate
from proxy.calibrate.render import check_policy, policy_toml
from proxy.errors import PolicyError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the model server, http://HOST:PORT")
    parser.add_argument("--out", "-o", default="-", help="policy file to write ('-': stdout)")
    parser.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    parser.add_argument(
        "--request",
        action="append",
        default=[],
        metavar="PATH=BODY",
        help="a request of your own to calibrate as a fixed-cost route (BODY: JSON, or @FILE); repeatable",
    )
    parser.add_argument(
        "--kinds",
        default="chat,completions,embeddings",
        help="OpenAI-style APIs to look for (comma-separated; empty: only --request)",
    )
    parser.add_argument("--max-concurrency", type=int, default=64, help="highest closed-loop users in the sweep")
    parser.add_argument("--quick", action="store_true", help="fewer samples: about half the time")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the server to be healthy")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="client timeout of each request")
    parser.add_argument("--metrics-path", default="/metrics", help="where the server's Prometheus metrics are")
    parser.add_argument(
        "--budget-ms",
        type=int,
        default=None,
        help="fix the default class's deadline budget by hand (ms) instead of the measured 4 turns; the other "
        "classes and CoDel follow it",
    )


def options_from(args: argparse.Namespace) -> Options:
    requests = []
    for spec in args.request:
        path, sep, body = spec.partition("=")
        if sep and body.startswith("@"):
            body = Path(body[1:]).read_text()
        requests.append(cs.parse_request(f"{path}={body}"))
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in cs.ENDPOINTS]
    if unknown:
        raise ValueError(f"unknown --kinds {', '.join(unknown)}; choose from {', '.join(cs.ENDPOINTS)}")
    quick = args.quick
    return Options(
        args.url,
        model=args.model,
        requests=tuple(requests),
        kinds=kinds,
        max_concurrency=args.max_concurrency,
        reps=3 if quick else 5,
        min_step_s=0.5 if quick else 1.0,
        max_step_s=15.0 if quick else 30.0,
        trials=2 if quick else 3,
        wait_s=args.wait_s,
        timeout_s=args.timeout_s,
        metrics_path=args.metrics_path,
    )


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise here
    if args.budget_ms is not None and args.budget_ms < 1:
        print("rampmeter calibrate: --budget-ms must be at least 1", file=sys.stderr)
        return 2
    try:
        options = options_from(args)
        cal = trio.run(calibrate, options)
    except (ValueError, OSError, CalibrationError) as exc:
        print(f"rampmeter calibrate: {exc}", file=sys.stderr)
        return 2
    command = "rampmeter calibrate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    text = policy_toml(cal, command=command.strip(), budget_ms=args.budget_ms)
    try:
        check_policy(text)
    except PolicyError as exc:  # a bug here, not the user's: say so and show the text
        print(text, file=sys.stderr)
        print(f"rampmeter calibrate: the written policy does not check: {exc}", file=sys.stderr)
        return 3
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(f"rampmeter calibrate: wrote {args.out} (limit {cal.limit}, {cal.health})", file=sys.stderr)
    return 0
