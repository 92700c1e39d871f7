"""A plain `__slots__` value class for the values built per request on the hot path.

Theory of operation: a frozen dataclass's `__init__` sets each field through
`object.__setattr__`, several times dearer than a plain attribute store; for the values
one request builds (Ticket, Lease, Admit, the deadline verdict, the relay's Forwarded)
that was ~8 us a request of the policy path (issue 16). `Value` keeps what the frozen
dataclasses gave the rest of the code: equality and hashing by the fields (`_FIELDS`,
in order) and a readable repr. Immutability is a convention: nothing assigns to a field
after construction.
"""

from __future__ import annotations


class Value:
    """A plain `__slots__` value class, equal by its fields (`_FIELDS`): one of these is built per
    request on the hot path, where a frozen dataclass's `__init__` (an `object.__setattr__` per
    field) cost ~8 us a Ticket against ~2.5 (issue 16). Treated as immutable by convention: nothing
    assigns to a field after construction (a changed value is a new one, e.g. `Ticket.with_class`).
    A subclass names its fields once, in the order eq, hash and repr use: `__slots__ = _FIELDS = (...)`."""

    __slots__ = ()
    _FIELDS: tuple[str, ...] = ()

    def _key(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self._FIELDS) + ")"
