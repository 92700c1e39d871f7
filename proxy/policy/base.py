"""What every policy table shares: the strict Section base and the cross-field check registry.

Feature tables (proxy/policy/<feature>.py) import from here, and `schema.py`
composes them; nothing here imports a feature, so there is no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from proxy.policy.schema import Policy


class Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Base for every policy table: strict about keys, immutable once loaded."""


CrossCheck = Callable[["Policy"], list[str]]
CROSS_CHECKS: list[CrossCheck] = []


def cross_check(fn: CrossCheck) -> CrossCheck:
    """Register a rule relating several fields; it returns one message per violation.

    All registered rules run after decoding, in `proxy.policy.load`, so every rule
    about how fields relate is found by grepping for this decorator.
    """
    CROSS_CHECKS.append(fn)
    return fn
