"""Policy errors an operator can act on: the line, the full key path with the class name, what is allowed.

The cases are the ones found by editing policies by hand, and each is also given to
check-jsonschema with the shipped schema (when installed, as in CI): every problem it
finds, we find at the same key path, and we add the line, the allowed values, a
"did you mean" and the rules that relate keys, which a JSON Schema cannot express.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from proxy.errors import PolicyError
from proxy.policy import reference
from proxy.policy.load import notes, parse_policy
from proxy.policy.toml_lines import key_lines, locate
from tests.conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / reference.SCHEMA_FILE


def errors_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, source="p.toml")
    return info.value.errors


# (policy text, the messages expected, in order: each a substring of one error line)
CASES = {
    "nested-range": (
        "[classes.realtime]\nmax_queue_length = -1\n",
        [
            "p.toml:2: classes.realtime.max_queue_length: Expected `int` >= 0, got -1 (allowed: integer, >= 0, <= 1000000)"
        ],
    ),
    "nested-type": (
        '[classes.batch]\npriority = "low"\n',
        ["p.toml:2: classes.batch.priority: Expected `int`, got `str` (allowed: integer, >= 0, <= 100)"],
    ),
    "top-level-typo": (
        "[clases.realtime]\npriority = 0\n",
        ["p.toml:1: clases: unknown key (allowed here: listen, admin,", "did you mean classes?"],
    ),
    "top-level-key": ("listen_address = 1\n", ["p.toml:1: listen_address: unknown key", "did you mean listen?"]),
    "nested-typo": (
        "[classes.realtime]\npriority = 0\nmax_queue_lenght = 3\n",
        ["p.toml:3: classes.realtime.max_queue_lenght: unknown key (allowed here: priority,", "max_queue_length?"],
    ),
    "enum-in-list": (
        '[shedding]\nrules = ["queue_length", "bogus"]\n',
        ["p.toml:2: shedding.rules[1]: Invalid enum value 'bogus' (expected one of: 'queue_length', 'gpu_memory',"],
    ),
    "enum-in-array-of-tables": (
        '[[upstreams]]\nurl = "http://a:1"\n[[upstreams]]\nurl = "http://b:1"\nprotocol = "h3"\n',
        ["p.toml:5: upstreams[1].protocol: Invalid enum value 'h3' (expected one of: 'http1', 'h2c')"],
    ),
    "required-key": (
        '[[upstreams]]\nprotocol = "h2c"\n',
        ["p.toml:1: upstreams[0].url: required key missing (allowed: http://HOST:PORT[/prefix]"],
    ),
    "bad-class-name": (
        "[classes.Realtime]\npriority = 0\n",
        ['p.toml:1: classes.Realtime: "Realtime" is not allowed as a name here: Lower-case class name'],
    ),
    "table-is-a-value": ("listen = 5\n", ["p.toml:1: listen: Expected `object`, got `int` (allowed: a table)"]),
    "every-problem-at-once": (
        '[listen]\nmax_connections = 0\n[admin]\naddress = "x"\n',
        [
            "p.toml:2: listen.max_connections: Expected `int` >= 1, got 0",
            'p.toml:4: admin.address: expected HOST:PORT, e.g. 0.0.0.0:8080 or [::1]:9090 (port 0-65535), got "x"',
        ],
    ),
    "port-out-of-range": ('[listen]\naddress = "127.0.0.1:99999"\n', ["p.toml:2: listen.address: expected HOST:PORT"]),
    "upstream-port": ('[[upstreams]]\nurl = "http://host:abc"\n', ["p.toml:2: upstreams[0].url: expected http://"]),
    "redis-url": (
        '[dedup]\nstore = "redis"\nredis_url = "redis://:6379/abc"\n',
        ["p.toml:3: dedup.redis_url: expected redis://[:PASSWORD@]HOST[:PORT][/DB]"],
    ),
    "min-above-max": ("[limits]\nmin_limit = 300\nmax_limit = 100\n", ["p.toml:2: limits.min_limit: 300 is above"]),
    # Only max_limit written: the line is max_limit's, the one the author can change.
    "max-below-default-min": ("[limits]\nmax_limit = 2\n", ["p.toml:2: limits.min_limit: 4 is above limits.max_limit"]),
    "rule-inside-a-table": (
        "[shedding]\nretry_after_min_ms = 5000\nretry_after_max_ms = 1000\n",
        ["p.toml:2: shedding: retry_after_min_ms must be <= retry_after_max_ms"],
    ),
    "inline-table": (
        "[scheduling]\nreserved_slots = { gold = 1 }\n",
        ["p.toml:2: scheduling.reserved_slots.gold: unknown class 'gold'"],
    ),
    "lost-default-class": (
        "[classes.realtime]\npriority = 0\n",
        ["scheduling.default_class: unknown class 'interactive'", "p.toml:1: note: [classes] replaces the default"],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_each_error_names_line_full_key_and_what_is_allowed(name):
    text, expected = CASES[name]
    joined = "\n".join(errors_of(text))
    for message in expected:
        assert message in joined, joined


def test_every_problem_is_reported_not_only_the_first():
    text = '[listen]\nmax_connections = 0\n[admin]\naddress = "x"\n[classes.batch]\nweight = 0\nbogus = 1\n'
    errors = errors_of(text)
    assert [e.split(": ")[1] for e in errors] == [
        "listen.max_connections",
        "admin.address",
        "classes.batch.weight",
        "classes.batch.bogus",
    ]


def test_did_you_mean_only_when_something_is_close():
    (error,) = errors_of("[listen]\nzzz = 1\n")
    assert "unknown key" in error and "did you mean" not in error


def test_errors_in_command_line_data_have_no_line():
    from proxy.policy.load import policy_from_builtins

    with pytest.raises(PolicyError) as info:
        policy_from_builtins({"listen": {"address": "nope"}}, "command line")
    assert info.value.errors[0].startswith("listen.address: expected HOST:PORT")


def test_key_lines_follow_toml_tables_arrays_and_multiline_values():
    text = (
        '[[upstreams]]\nurl = "a"\n[[upstreams]]\nurl = "b"\n'
        '[classes.realtime]\nnote = """\nfake = 1\n"""\nrules = [\n  { fake = 2 },\n]\n"quoted.key" = 3\n'
        "[[warmup.probes]]\ncount = 1\n"
    )
    lines = key_lines(text)
    assert lines["upstreams[1].url"] == 4 and lines["upstreams[0]"] == 1
    assert "classes.realtime.fake" not in lines  # inside a multi-line string and an array
    assert lines['classes.realtime."quoted.key"'] == 12
    assert lines["warmup.probes[0].count"] == 14
    assert locate(text, "classes.realtime.rules[0].fake") == 9  # an array element: its key's line
    assert locate(text, "upstreams[1].protocol") == 3  # not written: its table's header
    assert locate(text, "nothing") is None


# --- "[classes.realtime]" replaces the defaults: said loudly -------------------------


def test_policy_check_warns_when_a_default_class_is_tuned_and_the_others_are_lost():
    text = '[scheduling]\ndefault_class = "realtime"\n[classes.realtime]\npriority = 0\n'
    policy = parse_policy(text)
    assert list(policy.classes) == ["realtime"]  # replaced, as documented
    ((line, warning),) = notes(text)
    assert line == 3 and "interactive, batch are gone" in warning


def test_no_warning_for_a_policy_with_its_own_classes_or_all_defaults():
    assert notes("[classes.offline]\npriority = 0\n[scheduling]\ndefault_class = 'offline'\n") == []
    assert notes((ROOT / "policies" / "default.toml").read_text()) == []
    assert notes("") == []


def test_the_reference_says_classes_replace_the_defaults():
    text = (ROOT / "docs" / "policy-reference.md").read_text()
    assert "Written classes replace the defaults as a whole" in text


def test_policy_check_cli_prints_the_warning(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[scheduling]\ndefault_class = "realtime"\n[classes.realtime]\npriority = 0\n')
    done = _cli("policy", "check", str(path))
    assert done.returncode == 0 and f"{path}: ok" in done.stdout
    assert f"{path}:3: warning: [classes] replaces the default classes as a whole" in done.stderr


# --- the schema editors read -----------------------------------------------------------


def test_schema_declares_its_draft_and_id():
    schema = json.loads(_cli("policy", "schema").stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("/policy.json") and schema["title"] == "rampmeter policy"


def test_shipped_schema_file_is_current():
    assert SCHEMA.read_text() == reference.schema_json(), "run: make policy-docs"


def shipped_policies() -> list[Path]:
    return [*sorted((ROOT / "policies").glob("*.toml")), ROOT / "examples" / "kubernetes" / "policy.toml"]


@pytest.mark.parametrize("path", shipped_policies(), ids=lambda p: p.name)
def test_every_shipped_policy_points_editors_at_the_schema(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("#:schema ")
    target = (path.parent / first.removeprefix("#:schema ").strip()).resolve()
    assert target == SCHEMA.resolve()


def test_taplo_validates_shipped_policies_through_their_directive(tmp_path):
    taplo = require_binary("taplo")
    ok = subprocess.run(
        [taplo, "check", *map(str, shipped_policies())], capture_output=True, text=True, check=False, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(f"#:schema {SCHEMA}\n[classes.realtime]\nmax_queue_length = -1\n")
    failed = subprocess.run([taplo, "check", str(bad)], capture_output=True, text=True, check=False, timeout=120)
    assert failed.returncode != 0 and "minimum" in failed.stderr  # the directive is what found the schema


# --- at least as good as check-jsonschema ----------------------------------------------


def _pointer_to_path(pointer: str) -> str:
    """check-jsonschema's `$.classes.realtime.x` / `$.rules[1]` -> our `classes.realtime.x`."""
    return pointer.removeprefix("$").removeprefix(".")


# Rules relating keys: no JSON Schema says them, so the standard tools pass these files.
RULES = {"min-above-max", "max-below-default-min", "rule-inside-a-table", "inline-table", "lost-default-class"}


@pytest.mark.parametrize("name", CASES)
def test_every_problem_check_jsonschema_finds_we_find_at_the_same_key(name, tmp_path):
    tool = require_binary("check-jsonschema")
    text, _ = CASES[name]
    path = tmp_path / "p.toml"
    path.write_text(text)
    done = subprocess.run(
        [tool, "--schemafile", str(SCHEMA), "-o", "json", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    theirs = json.loads(done.stdout)["errors"]
    if name in RULES:
        assert theirs == [] and errors_of(text)  # only we catch it
        return
    assert theirs, f"check-jsonschema found nothing in {name}"
    ours = "\n".join(errors_of(text))
    for error in theirs:
        key = _pointer_to_path(error["path"])
        unexpected = re.search(r"'([^']+)' was unexpected", error["message"])
        if unexpected:  # additionalProperties: they name the table, we name the key
            key = f"{key}.{unexpected[1]}" if key else unexpected[1]
        if "does not match" in error["message"] and key.startswith("classes") and key.count(".") == 0:
            key = "classes.Realtime"  # propertyNames: they name the map, we name the entry
        if "is a required property" in error["message"]:
            key += "." + re.search(r"'([^']+)'", error["message"])[1]
        assert f": {key}: " in ours, (error, ours)


def _cli(*args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], capture_output=True, text=True, check=False, timeout=60, cwd=ROOT
    )
