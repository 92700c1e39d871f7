"""The attack generators themselves (proxy/testing/attacks.py), as bench/attacks runs them: each one attacks.

A control for the benchmark, not a defence test (those are per defect): every attack,
briefly and from one worker, against one real sidecar, must open connections and
send what it says (frames, requests, sockets), and be answered somehow; the sidecar
must still answer /healthz afterwards.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from proxy.testing import attacks
from tests.security.harness import attacked_stack

pytestmark = pytest.mark.integration


def test_every_attack_attacks():
    with attacked_stack() as stack:
        cl_te = attacks.run("cl_te", stack.data, 0.3, 1)
        assert any(k.startswith("status:") for k in cl_te.outcomes), cl_te  # it reads answers, too
        for name in sorted(attacks.ATTACKS):
            tally = attacks.run(name, stack.data, 0.3, 1)
            assert tally.connections >= 1 and tally.sent >= 1, tally
        assert httpx.get(stack.admin + "/healthz", timeout=30).status_code == 200


def test_production_code_never_imports_the_attacks():
    root = Path(__file__).resolve().parents[2] / "proxy"
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "testing" not in path.relative_to(root).parts and "proxy.testing.attacks" in path.read_text()
    ]
    assert offenders == []


def test_the_frame_reader_tells_answers_apart():
    reader = attacks.FrameReader()
    goaway = (
        (8).to_bytes(3, "big") + b"\x07\x00" + (0).to_bytes(4, "big") + (1).to_bytes(4, "big") + (11).to_bytes(4, "big")
    )
    rst = (4).to_bytes(3, "big") + b"\x03\x00" + (5).to_bytes(4, "big") + (7).to_bytes(4, "big")
    reader.feed(rst + goaway[:5])
    reader.feed(goaway[5:])
    assert reader.goaway == "ENHANCE_YOUR_CALM" and reader.resets == {"REFUSED_STREAM": 1} and reader.answered == {5}
