"""`rampmeter` command line: one subcommand per module that owns it.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`;
this file only wires them together, so `--help` on every command is complete and
nothing here knows what a command does.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# (name, module, one-line help). Modules are imported when the parser is built.
COMMANDS: list[tuple[str, str, str]] = [
    ("serve", "proxy.serve", "run the sidecar in front of a model server"),
    ("policy", "proxy.policy.cli", "check a policy file, or print its JSON Schema"),
    ("sim-pod", "proxy.testing.simpod.cli", "run the simulated GPU inference pod"),
    ("loadtest", "proxy.loadtest.cli", "drive load at a URL and report latency, goodput and the knee"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rampmeter",
        description="Admission-control sidecar for GPU inference pods.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name, help_text in COMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip().splitlines()[0],
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `rampmeter policy schema | head`: the reader went away. Quiet, like other Unix tools;
        # stdout is pointed at /dev/null so the interpreter's own final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it


if __name__ == "__main__":
    sys.exit(main())
