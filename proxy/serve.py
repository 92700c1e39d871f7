"""Run the sidecar: `rampmeter serve [--policy FILE] [--listen H:P] [--admin H:P] [--upstream URL ...]`.

With no policy file the embedded defaults serve (every key's default is in
`policies/default.toml` and `rampmeter policy schema`). Flags override the file.
SIGTERM/SIGINT drain gracefully and exit 0; SIGHUP re-reads the policy file.

A start-up problem the operator can fix (an invalid or unreadable policy, a bad
flag value, a port already in use, an address not on this host) prints one line per
problem, `rampmeter: ...`, and exits 1; a traceback means a bug in rampmeter.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys

import msgspec
import trio

from proxy.errors import PolicyError, StartupError
from proxy.http import heap
from proxy.policy.load import load_policy, policy_from_builtins
from proxy.policy.schema import Policy
from proxy.ready import print_ready
from proxy.runtime.reload import PolicyVersion, digest

log = logging.getLogger("rampmeter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy", metavar="FILE", help="policy TOML file (watched and reloaded live); default: embedded defaults"
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="data listener, overrides listen.address (default 0.0.0.0:8080)"
    )
    parser.add_argument(
        "--admin", metavar="HOST:PORT", help="admin listener, overrides admin.address (default 127.0.0.1:9090)"
    )
    parser.add_argument(
        "--upstream",
        metavar="URL",
        action="append",
        help="model server base URL, repeatable; replaces [[upstreams]], but one the policy also lists keeps "
        "its settings (default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--upstream-protocol",
        choices=("http1", "h2c"),
        default=None,
        help="protocol for --upstream URLs (default http1)",
    )


# Policy keys the flags set, so an invalid flag value is reported as the flag.
_FLAG_KEYS = (
    (r"listen\.address", "--listen"),
    (r"admin\.address", "--admin"),
    (r"upstreams\[\d+\]\.url", "--upstream"),
)


def resolve_policy(args: argparse.Namespace) -> tuple[Policy, PolicyVersion, Policy]:
    """The policy file (or defaults) with command-line overrides applied and validated; and the file's own."""
    if args.policy:
        policy = load_policy(args.policy)
        with open(args.policy, "rb") as f:
            version = PolicyVersion(args.policy, 1, digest(f.read()), 0.0)
    else:
        policy = Policy()
        version = PolicyVersion("embedded default", 1, "", 0.0)
    data = msgspec.to_builtins(policy)
    if args.listen:
        data["listen"]["address"] = args.listen
    if args.admin:
        data["admin"]["address"] = args.admin
    if args.upstream:
        data["upstreams"] = _upstreams_from_flags(args, data["upstreams"] if args.policy else [])
    # Overrides get exactly the checks a file gets, with errors naming the flag.
    try:
        return policy_from_builtins(data, "command line"), version, policy
    except PolicyError as exc:
        raise PolicyError("command line", [_as_flag(line) for line in exc.errors]) from None


def _upstreams_from_flags(args: argparse.Namespace, in_file: list[dict]) -> list[dict]:
    """`--upstream` names the servers; an upstream the policy file also names keeps the file's
    settings (stops_on_cancel, timeout_s, ...: what calibrate learnt), with --upstream-protocol
    applied when given. Upstreams of the file that no flag names are dropped, with a warning."""
    by_url = {u["url"].rstrip("/"): u for u in in_file}
    chosen = []
    for url in args.upstream:
        known = by_url.get(url.rstrip("/"))
        upstream = {"url": url, "protocol": "http1"} if known is None else {**known, "url": url}
        if args.upstream_protocol:
            upstream["protocol"] = args.upstream_protocol
        chosen.append(upstream)
    named = {url.rstrip("/") for url in args.upstream}
    dropped = [u["url"] for u in in_file if u["url"].rstrip("/") not in named]
    if dropped:
        log.warning("--upstream replaces the policy's [[upstreams]]: %s and its settings not used", ", ".join(dropped))
    return chosen


def _as_flag(line: str) -> str:
    for pattern, flag in _FLAG_KEYS:
        line = re.sub(rf"^{pattern}:", f"{flag}:", line)
    return line


def run(args: argparse.Namespace) -> int:
    try:
        policy, version, file_policy = resolve_policy(args)
    except PolicyError as exc:
        for line in exc.errors:
            where = "" if line.startswith((exc.source, "--")) else f"{exc.source}: "
            print(f"rampmeter: {where}{line}", file=sys.stderr)
        return 1
    try:
        trio.run(_serve, policy, version, args.policy, file_policy)
    except BaseException as exc:
        message = startup_failure(exc)
        if message is None:
            raise
        print(f"rampmeter: {message}", file=sys.stderr)
        return 1
    return 0


def startup_failure(exc: BaseException) -> str | None:
    """The one line to print when `exc` (maybe wrapped in exception groups) is only a StartupError."""
    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, BaseExceptionGroup):
        found, rest = exc.split(StartupError)
        if found is not None and rest is None:
            return startup_failure(found.exceptions[0])
    return None


async def _serve(policy: Policy, version: PolicyVersion, policy_path: str | None, file_policy: Policy) -> None:
    from proxy.app import App  # imported late so `rampmeter --help` stays fast

    app = App(policy, version, policy_path=policy_path, file_policy=file_policy)
    # Receive signals before announcing readiness, so a prompt SIGTERM is never lost.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(app.run, policy.listen.address, policy.admin.address)
            heap.settle()  # start-up is done: freeze its heap out of the GC's passes (proxy/http/heap.py)
            print_ready(addresses)
            async for signum in signals:
                log.info("%s received", signal.Signals(signum).name)
                break
            await app.shutdown()
    log.info("stopped")
