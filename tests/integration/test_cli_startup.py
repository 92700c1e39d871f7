"""Start-up as an operator meets it: the real CLI in a subprocess, one line per problem, exit 1.

Every start-up error a user can cause (a port in use, an address not on this host, a
bad flag value, a missing, unreadable or invalid policy file) must print `rampmeter:
...` and exit 1, never a traceback; `--help`, `--version` and `--log-format json` are
checked the same way.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import build

ROOT = Path(__file__).resolve().parents[2]


def rampmeter(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], capture_output=True, text=True, check=False, timeout=timeout, cwd=ROOT
    )


def serve(*args: str) -> subprocess.CompletedProcess:
    """`rampmeter serve` expected to fail at start-up (a hang past the timeout fails the test)."""
    defaults = {"--listen": "127.0.0.1:0", "--admin": "127.0.0.1:0"}
    extra = [x for flag, value in defaults.items() if flag not in args for x in (flag, value)]
    return rampmeter("serve", *args, *extra)


def said(done: subprocess.CompletedProcess) -> list[str]:
    """The lines rampmeter itself printed about the failure (log lines such as NVML's warning aside)."""
    assert "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("rampmeter: ")]


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_data_port_in_use_is_one_line_and_exit_1(taken_port):
    done = serve("--listen", f"127.0.0.1:{taken_port}")
    assert done.returncode == 1
    assert said(done) == [f"rampmeter: cannot listen on 127.0.0.1:{taken_port}: address already in use"]


def test_an_open_file_limit_with_no_room_for_clients_is_one_line():
    done = subprocess.run(
        [
            "bash",
            "-c",
            f"ulimit -n 200 && exec {sys.executable} -m proxy serve --upstream http://127.0.0.1:1"
            " --listen 127.0.0.1:0 --admin 127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    (line,) = said(done)
    assert line.startswith("rampmeter: the open-file limit (200) leaves no room for client connections"), line


def test_admin_port_in_use_too(taken_port):
    done = serve("--admin", f"127.0.0.1:{taken_port}")
    assert done.returncode == 1
    assert said(done) == [f"rampmeter: cannot listen on 127.0.0.1:{taken_port}: address already in use"]


def test_an_address_not_on_this_host():
    done = serve("--listen", "192.0.2.1:8080")  # TEST-NET-1: never a local address; no packet is sent
    assert done.returncode == 1
    assert said(done) == ["rampmeter: cannot listen on 192.0.2.1:8080: no such address on this host"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--listen", "127.0.0.1:99999"), "rampmeter: --listen: expected HOST:PORT, e.g. 0.0.0.0:8080"),
        (("--listen", "nohost"), "rampmeter: --listen: expected HOST:PORT"),
        (("--admin", "[::1:80"), "rampmeter: --admin: expected HOST:PORT"),
        (("--upstream", "ftp://model:80"), "rampmeter: --upstream: expected http://HOST:PORT[/prefix]"),
        (("--upstream", "http://model:abc"), "rampmeter: --upstream: expected http://HOST:PORT[/prefix]"),
        (("--upstream", "http://model:70000"), "rampmeter: --upstream: expected http://HOST:PORT[/prefix]"),
    ],
)
def test_bad_flag_values_name_the_flag(args, line):
    done = serve(*args)
    assert done.returncode == 1
    (only,) = said(done)
    assert only.startswith(line) and f'got "{args[1]}"' in only, only


def test_missing_unreadable_and_non_utf8_policy_files(tmp_path):
    missing = tmp_path / "missing.toml"
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[listen]\n")
    cases = {
        missing: f"rampmeter: {missing}: cannot read the policy file: No such file or directory",
        tmp_path: f"rampmeter: {tmp_path}: cannot read the policy file: Is a directory",
        binary: f"rampmeter: {binary}: not UTF-8 text (byte 0); a policy is a TOML file",
    }
    for path, line in cases.items():
        done = serve("--policy", str(path))
        assert done.returncode == 1 and said(done) == [line]


def test_an_invalid_policy_prints_each_problem_with_its_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[listen]\nmax_connections = 0\n[dedup]\nstore = "redis"\nredis_url = "redis://:6379/x"\n')
    done = serve("--policy", str(path))
    assert done.returncode == 1
    lines = said(done)
    assert [line.split(": ")[1] for line in lines] == [f"{path}:2", f"{path}:5"], lines
    assert "listen.max_connections" in lines[0] and "dedup.redis_url" in lines[1]


def test_not_valid_toml(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[listen\n")
    done = serve("--policy", str(path))
    assert done.returncode == 1
    (line,) = said(done)
    assert line.startswith(f"rampmeter: {path}: not valid TOML")


def test_json_log_format_writes_one_object_per_line(taken_port):
    done = serve("--listen", f"127.0.0.1:{taken_port}", "--log-format", "json", "--log-level", "debug")
    assert done.returncode == 1
    logs = [line for line in done.stderr.splitlines() if not line.startswith("rampmeter: ")]
    assert logs, done.stderr  # at least the GPU / start-up lines
    for line in logs:
        record = json.loads(line)
        assert {"time", "level", "logger", "message"} <= record.keys()
        assert record["time"].endswith("Z") and record["level"] in ("debug", "info", "warning", "error")


# --- help and version ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "loadtest", "sim-pod", "policy"])
def test_help_says_each_default_once(command):
    done = rampmeter(command, "--help")
    assert done.returncode == 0
    options = help_blocks(done.stdout)
    assert len(options) >= 2
    for option in options:
        assert "(default: None)" not in option and option.count("(default") <= 1, option


def help_blocks(text: str) -> list[str]:
    """Each option's entry in argparse help, wrapped lines joined."""
    blocks: list[str] = []
    for line in text.splitlines():
        if re.match(r"^ {2}-", line):
            blocks.append(line.strip())
        elif blocks and re.match(r"^ {4,}\S", line):
            blocks[-1] += " " + line.strip()
        elif not line.startswith(" "):
            blocks.append("")  # a heading ends the block before it
    return [b for b in blocks if b]


def test_log_level_and_format_have_help():
    text = " ".join(rampmeter("serve", "--help").stdout.split())
    assert "--log-level {debug,info,warning,error} least severe log lines" in text
    assert "--log-format {text,json}" in text and "log shippers" in text


def test_version():
    done = rampmeter("--version")
    assert done.returncode == 0
    assert done.stdout.strip().startswith(f"rampmeter {build.version()} (Python {build.python_version()}")
    assert build.version() != "0+unknown"  # installed by make setup: the distribution's version
