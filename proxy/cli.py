"""`rampmeter` command line: one subcommand per module that owns it.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`;
this file only wires them together, so `--help` on every command is complete and
nothing here knows what a command does. Every command also takes `--log-level` and
`--log-format` (proxy/logs.py), set up here before the command runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from proxy import build, logs

# (name, module, one-line help, default log level). Modules are imported when the parser is built.
# Only the sidecar logs at info by default; the other commands print their own reports.
COMMANDS: list[tuple[str, str, str, str]] = [
    ("serve", "proxy.serve", "run the sidecar in front of a model server", "info"),
    ("policy", "proxy.policy.cli", "check a policy file, or print its JSON Schema", "warning"),
    ("sim-pod", "proxy.testing.simpod.cli", "run the simulated GPU inference pod", "warning"),
    ("loadtest", "proxy.loadtest.cli", "drive load at a URL and report latency, goodput and the knee", "warning"),
]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default once: not when its help already says it, nor for None and on/off switches."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, argparse.SUPPRESS) or isinstance(action.default, bool):
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rampmeter",
        description="Admission-control sidecar for GPU inference pods.",
    )
    parser.add_argument("--version", action="version", version=build.describe())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name, help_text, log_level in COMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip().splitlines()[0],
            formatter_class=HelpFormatter,
        )
        module.add_arguments(p)
        logs.add_arguments(p, default_level=log_level)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
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
