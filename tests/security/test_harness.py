"""The harness itself: with no attack, a bystander is served and every check passes.

This is the control for every attack test in this tier: if it fails, the attack
tests' failures say nothing about the attacks.
"""

from __future__ import annotations

import time

import pytest

from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2c"])
def test_no_attack_every_check_passes(http2):
    with attacked_stack() as stack:
        with Bystander(stack, rate=20, http2=http2) as bystander:
            time.sleep(1.5)
        report = bystander.report()
        report.check(min_success=1.0, max_p99_s=0.5, max_rss_mib=256)
        assert report.sent >= 20
        assert_clean_log(stack.sidecar)
