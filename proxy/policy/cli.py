"""Check policy files and export the policy JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys

from proxy.errors import PolicyError
from proxy.policy.load import load_policy
from proxy.policy.schema import Policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = sub.add_parser("check", help="validate policy files; exit 0 if all are valid, 1 if not")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy TOML files")
    sub.add_parser("schema", help="print the policy's JSON Schema (for editors and CI)")


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    failed = False
    for path in args.files:
        try:
            load_policy(path)
        except PolicyError as exc:
            failed = True
            for line in exc.errors:
                print(line if line.startswith(str(path)) else f"{path}: {line}", file=sys.stderr)
        else:
            print(f"{path}: ok")
    return 1 if failed else 0


def json_schema() -> dict:
    import msgspec

    schema = msgspec.json.schema(Policy)
    schema["$id"] = "https://rampmeter.dev/schema/policy.json"
    schema["title"] = "rampmeter policy"
    return schema
