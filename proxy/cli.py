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

# (name, module, one-line help, default log level, the pyproject extra it needs). Modules are
# imported when the parser is built. Only the sidecar logs at info by default; the other
# commands print their own reports.
COMMANDS: list[tuple[str, str, str, str, str]] = [
    ("serve", "proxy.serve", "run the sidecar in front of a model server", "info", "sidecar"),
    ("policy", "proxy.policy.cli", "check a policy file, or print its JSON Schema", "warning", "sidecar"),
    ("sim-pod", "proxy.simpod.cli", "run the simulated GPU inference pod", "warning", "sidecar"),
    (
        "loadtest",
        "proxy.loadtest.cli",
        "drive load at a URL and report latency, goodput and the knee",
        "warning",
        "loadtest",
    ),
    (
        "calibrate",
        "proxy.calibrate.cli",
        "probe a running model server and write a commented policy for it",
        "info",
        "loadtest",
    ),
]


def _missing_extra(name: str, extra: str, missing: str):
    """`run` for a command whose extra is not installed: `pip install rampmeter` is the SDK alone."""

    def run(args) -> int:
        print(
            f"rampmeter {name} needs the '{extra}' extra ({missing} is not installed): "
            f"pip install 'rampmeter[{extra}]'",
            file=sys.stderr,
        )
        return 2

    return run


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default once: not when its help already says it, nor for None and on/off switches."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, argparse.SUPPRESS) or isinstance(action.default, bool):
            return text
        return super()._get_help_string(action) or ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rampmeter",
        description="Admission-control sidecar for GPU inference pods.",
    )
    parser.add_argument("--version", action="version", version=build.describe())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name, help_text, log_level, extra in COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "proxy":
                raise  # our own module is missing: a bug, not an extra
            needs = f"needs rampmeter[{extra}]"
            # Takes any arguments (no option parsing: prefix_chars matches nothing) and says what to install.
            p = sub.add_parser(name, help=f"{help_text} ({needs})", add_help=False, prefix_chars="\0")
            p.add_argument("ignored", nargs="*")
            p.set_defaults(_run=_missing_extra(name, extra, exc.name or "a dependency"), log_level="warning")
            p.set_defaults(log_format="text")
            continue
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
