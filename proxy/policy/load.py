"""Load and validate a policy: TOML text in, a whole `Policy` or a `PolicyError` out.

Theory of operation: msgspec decodes the TOML and converts it to `schema.Policy` in
one go (types, ranges, unknown keys). When that fails, `proxy.policy.explain` finds
every problem with its full key path (`classes.realtime.max_queue_length`) and what
is allowed, and `proxy.policy.toml_lines` the line that writes it, so each error
reads `FILE:LINE: KEY: what is wrong (allowed: ...)`. Checks that span several
fields are registered with `proxy.policy.base.cross_check` and run together after
decoding, so every rule about how fields relate lives in one place; their messages
start with the key they blame, which gets its line the same way.

`notes` says what a valid policy does that its author may not expect: written
`[classes.*]` tables replace the default classes as a whole (the decision, and why,
is in docs/policy-reference.md), so a file that tunes `[classes.realtime]` alone has
lost interactive and batch; `rampmeter policy check` prints it as a warning.

A policy *file* that sets nothing (empty, whitespace, or comments only) is refused
(`parse_policy_file`, used at start, by `rampmeter policy check` and by the live
reloader): applied, it would reset every tuned setting to its default, and that is
what a truncated write or an editor's non-atomic save (truncate, then write) shows
the reloader in between. Comments-only counts too: a truncated copy of a commented
file such as policies/default.toml is just its header comment. Running on the
defaults stays one step away: no --policy, or a file with an empty table (`[listen]`).
`parse_policy("")` (text, not a file) still means the defaults, for tests and callers
that build policies from strings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from proxy.errors import PolicyError
from proxy.policy import explain, toml_lines
from proxy.policy.base import CROSS_CHECKS
from proxy.policy.schema import Policy

EMPTY_FILE = (
    "the file sets nothing (empty, whitespace or comments only); refused, because applying it would reset "
    "every setting to its default (a truncated write or a non-atomic editor save looks like this). "
    "To run on the defaults, omit --policy or write an empty table such as [listen]"
)


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    return parse_policy_file(read_policy_text(path), source=str(path))


def read_policy_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(str(path), [f"cannot read the policy file: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise PolicyError(str(path), [f"not UTF-8 text (byte {exc.start}); a policy is a TOML file"]) from None


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    return policy_from_builtins(_decode(text, source), source, text)


def parse_policy_file(text: str, source: str) -> Policy:
    """A policy file's text -> Policy; a file that sets nothing is an error (see module doc)."""
    data = _decode(text, source)
    if not data:
        raise PolicyError(source, [f"{source}: {EMPTY_FILE}"])
    return policy_from_builtins(data, source, text)


def _decode(text: str, source: str) -> dict[str, Any]:
    try:
        decoded: dict[str, Any] = msgspec.toml.decode(text.encode("utf-8"))
        return decoded
    except msgspec.DecodeError as exc:
        raise PolicyError(source, [f"not valid TOML: {_toml_message(exc)}"]) from None


def policy_from_builtins(data: dict[str, Any], source: str, text: str = "") -> Policy:
    """Validate plain data (decoded TOML, or defaults with command-line overrides)."""
    try:
        policy = msgspec.convert(data, type=Policy)
    except msgspec.ValidationError as exc:
        found = explain.problems(data, Policy)
        lines = [_render(p.path, p.message, text, source, p.line_parts) for p in found]
        raise PolicyError(source, lines or [str(exc)]) from None
    problems = [msg for check in CROSS_CHECKS for msg in check(policy)]
    if problems:
        # The surprises explain many rule failures (`[classes.realtime]` alone loses default_class).
        hints = [f"{source}:{line}: note: {note}" if line else f"note: {note}" for line, note in notes(text)]
        raise PolicyError(source, [_render_rule(msg, text, source) for msg in problems] + hints)
    return policy


def notes(text: str) -> list[tuple[int | None, str]]:
    """(line, warning) for what a valid policy text does that its author may not expect."""
    try:
        data = msgspec.toml.decode(text.encode("utf-8"))
    except msgspec.DecodeError:
        return []
    out = []
    classes = data.get("classes")
    if isinstance(classes, dict):
        # A policy that names its own classes (offline, backfill) means to replace them; one that
        # writes some default names and not others most likely meant to tune one and lost the rest.
        defaults = list(Policy().classes)
        gone = [name for name in defaults if name not in classes]
        if gone and any(name in defaults for name in classes):
            out.append(
                (
                    toml_lines.locate(text, "classes"),
                    f"[classes] replaces the default classes as a whole: this policy has only {', '.join(classes)}; "
                    f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone, and requests naming "
                    f"{'it' if len(gone) == 1 else 'them'} in x-priority are served as scheduling.default_class "
                    "(write every class you want; policies/default.toml has the defaults)",
                )
            )
    return out


def locate(text: str, path: str) -> int | None:
    """1-based line in TOML `text` where `path` (a.b[2].c) or its closest written parent is, or None."""
    return toml_lines.locate(text, path) if text else None


def _render(path: str, message: str, text: str, source: str, line_parts: tuple[Any, ...] | None = None) -> str:
    at = toml_lines.path_text(list(line_parts)) if line_parts else path
    line = locate(text, at)
    where = f"{source}:{line}: " if line else ""
    return f"{where}{path or '(top level)'}: {message}"


# A rule's message starts with the key it blames: `limits.min_limit: ...`, `warmup.probes[0].count = 3 ...`.
_BLAMED = re.compile(r'^(?P<path>[A-Za-z0-9_\-]+(?:\[\d+\]|\.[A-Za-z0-9_\-]+|\."[^"]*")*)(?P<rest>[:\s].*)$', re.S)


_NAMED = re.compile(r"\b[a-z_]+(?:\[\d+\])?(?:\.[a-z_]+(?:\[\d+\])?)+\b")


def _render_rule(message: str, text: str, source: str) -> str:
    """A rule's message with the line of the key it blames, or of another key it names that the file writes
    (`min_limit > max_limit` in a file that sets only max_limit points at max_limit)."""
    m = _BLAMED.match(message)
    written = toml_lines.key_lines(text) if text else {}
    named = [m["path"]] if m else []
    named += [p for p in _NAMED.findall(message) if p not in named]
    line = next((written[p] for p in named if p in written), None)
    if line is None and m:
        line = locate(text, m["path"])
    return f"{source}:{line}: {message}" if line else message


def _toml_message(exc: msgspec.DecodeError) -> str:
    cause = exc.__cause__ or exc.__context__
    return str(cause or exc)
