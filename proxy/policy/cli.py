"""Check policy files and export the policy JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from proxy.errors import PolicyError
from proxy.policy.load import notes, parse_policy_file, read_policy_text
from proxy.policy.schema import Policy

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "https://rampmeter.dev/schema/policy.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = sub.add_parser(
        "check", help="validate policy files and warn about surprises; exit 0 if all are valid, 1 if not"
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="policy TOML files")
    sub.add_parser("schema", help="print the policy's JSON Schema (for editors and CI)")


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    failed = False
    for path in args.files:
        try:
            text = read_policy_text(Path(path))
            parse_policy_file(text, source=str(path))
        except PolicyError as exc:
            failed = True
            for line in exc.errors:
                print(line if line.startswith(str(path)) else f"{path}: {line}", file=sys.stderr)
        else:
            print(f"{path}: ok")
            for at, warning in notes(text):
                print(f"{path}:{at}: warning: {warning}" if at else f"{path}: warning: {warning}", file=sys.stderr)
    return 1 if failed else 0


def json_schema() -> dict[str, Any]:
    import msgspec

    # $schema first: editors (taplo / Even Better TOML, VS Code) read it to pick the draft.
    schema = {"$schema": SCHEMA_URI, "$id": SCHEMA_ID, "title": "rampmeter policy"}
    schema.update(msgspec.json.schema(Policy))
    return schema
