"""Defect 10: a policy file that sets nothing is refused, never applied as "all defaults".

A truncated write or a non-atomic editor save (truncate, then write) shows the
reloader an empty file for a moment; applying it would reset every tuned setting.
Through a real sidecar: an empty, a whitespace-only and a comments-only file are each
rejected on reload (counted, logged, the old version stays in force and keeps
serving with its tuned limits), and the next real file is taken. At start, `serve
--policy EMPTY` exits 2 with a message that says what to do instead.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from proxy.errors import PolicyError
from proxy.policy.load import parse_policy, parse_policy_file
from proxy.policy.schema import Policy
from proxy.testing.procs import wait_for
from proxy.testing.stack import sim_pod
from tests.security.harness import CHAT, assert_clean_log
from tests.security.reload_helpers import BASE, admin_policy, metric, served_from, wait_version, write_atomically

pytestmark = pytest.mark.integration

TUNED = BASE + "[listen]\nmax_body_bytes = 1000\n[limits]\nkind = 'fixed'\ninitial_limit = 3\nmin_limit = 1\n"
NOTHING = {"empty": "", "whitespace": " \n\t\n  \n", "comments": "# rampmeter policy\n# (truncated here)\n"}


@pytest.fixture(scope="module")
def pod():
    with sim_pod(speed=20.0) as proc:
        yield proc


def test_a_file_that_sets_nothing_is_rejected_on_reload(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(TUNED)
    with served_from(pod, path) as proc:
        sha = admin_policy(proc)["sha256"]
        errors = 'rampmeter_policy_reloads_total{result="error"}'
        for kind, text in NOTHING.items():
            seen = metric(proc, errors)
            if kind == "empty":
                path.write_text(text)  # truncation in place, as a non-atomic save does first
            else:
                write_atomically(path, text)
            wait_for(lambda seen=seen: metric(proc, errors) > seen, timeout_s=15)  # the 1 s poll saw it
            doc = admin_policy(proc)
            assert (doc["version"], doc["sha256"]) == (1, sha), kind
            assert doc["policy"]["listen"]["max_body_bytes"] == 1000, kind
            assert doc["policy"]["limits"]["initial_limit"] == 3, kind
        # Still in force on the wire: the tuned body cap.
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        assert httpx.post(proc.url() + "/v1/chat/completions", json=big, timeout=10).status_code == 413
        assert httpx.post(proc.url() + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        log = proc.log()
        assert "policy reload rejected, keeping version 1" in log and "sets nothing" in log
        # A real file again: taken.
        write_atomically(path, TUNED.replace("initial_limit = 3", "initial_limit = 5"))
        assert wait_version(proc, 2)["policy"]["limits"]["initial_limit"] == 5
        assert_clean_log(proc)


@pytest.mark.parametrize("kind", sorted(NOTHING))
def test_serve_refuses_a_policy_file_that_sets_nothing(tmp_path, kind):
    path = tmp_path / "policy.toml"
    path.write_text(NOTHING[kind])
    argv = [sys.executable, "-m", "proxy", "serve", "--policy", str(path), "--listen", "127.0.0.1:0"]
    done = subprocess.run([*argv, "--admin", "127.0.0.1:0"], capture_output=True, text=True, timeout=15)
    assert done.returncode == 1, done.stderr  # a start-up error the operator can fix: one line, exit 1
    assert f"rampmeter: {path}: the file sets nothing" in done.stderr
    assert "omit --policy" in done.stderr and "rampmeter-ready" not in done.stdout


def test_policy_check_refuses_it_too(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "policy", "check", str(path)], capture_output=True, text=True)
    assert done.returncode == 1 and "sets nothing" in done.stderr


@pytest.mark.parametrize("text", NOTHING.values(), ids=NOTHING.keys())
def test_the_rule_itself(text):
    with pytest.raises(PolicyError, match="sets nothing"):
        parse_policy_file(text, "p.toml")
    assert parse_policy(text) == Policy()  # text, not a file: still the defaults
    assert parse_policy_file(text + "[listen]\n", "p.toml") == Policy()  # the documented way to say "defaults"
