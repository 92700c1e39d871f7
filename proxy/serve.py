"""Run the sidecar: `rampmeter serve [--policy FILE] [--listen H:P] [--admin H:P] [--upstream URL ...]`.

With no policy file the embedded defaults serve (every key's default is in
`policies/default.toml` and `rampmeter policy schema`). Flags override the file.
SIGTERM/SIGINT drain gracefully and exit 0; SIGHUP re-reads the policy file.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import msgspec
import trio

from proxy.errors import PolicyError
from proxy.policy.load import load_policy, policy_from_builtins
from proxy.policy.schema import Policy
from proxy.runtime.reload import PolicyVersion, digest
from proxy.testing.procs import print_ready

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
        help="model server base URL, repeatable; replaces [[upstreams]] (default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--upstream-protocol",
        choices=("http1", "h2c"),
        default=None,
        help="protocol for --upstream URLs (default http1)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def resolve_policy(args: argparse.Namespace) -> tuple[Policy, PolicyVersion]:
    """The policy file (or defaults) with command-line overrides applied and validated."""
    if args.policy:
        policy = load_policy(args.policy)
        with open(args.policy, "rb") as f:
            version = PolicyVersion(args.policy, 1, digest(f.read()), 0.0)
    else:
        policy = Policy()
        version = PolicyVersion("embedded default", 1, "", 0.0)
    return with_overrides(policy, args), version


def with_overrides(policy: Policy, args: argparse.Namespace) -> Policy:
    """`policy` with the command-line flags applied (at start, and to every reloaded file)."""
    data = msgspec.to_builtins(policy)
    if args.listen:
        data["listen"]["address"] = args.listen
    if args.admin:
        data["admin"]["address"] = args.admin
    if args.upstream:
        protocol = args.upstream_protocol or "http1"
        data["upstreams"] = [{"url": url, "protocol": protocol} for url in args.upstream]
    # Overrides get exactly the checks a file gets, with errors naming the key.
    return policy_from_builtins(data, "command line")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per health check is noise
    try:
        policy, version = resolve_policy(args)
    except PolicyError as exc:
        for line in exc.errors:
            print(f"rampmeter: invalid policy: {line}", file=sys.stderr)
        return 2
    trio.run(_serve, policy, version, args)
    return 0


async def _serve(policy: Policy, version: PolicyVersion, args: argparse.Namespace) -> None:
    from proxy.app import App  # imported late so `rampmeter --help` stays fast

    app = App(policy, version, policy_path=args.policy, overrides=lambda p: with_overrides(p, args))
    # Receive signals before announcing readiness, so a prompt SIGTERM is never lost.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(app.run, policy.listen.address, policy.admin.address)
            print_ready(addresses)
            async for signum in signals:
                log.info("%s received", signal.Signals(signum).name)
                break
            await app.shutdown()
    log.info("stopped")
