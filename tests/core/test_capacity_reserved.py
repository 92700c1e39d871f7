"""Reserved slots under a small limit: scaled down to leave every class one unit (issue 12)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.capacity import Capacity
from proxy.core.decisions import Admit, Outcome
from proxy.core.limits import FixedLimit
from tests.core.test_admission import make_policy, ticket


def test_a_limit_of_one_has_no_reservations_and_serves_every_class():
    cap = Capacity([FixedLimit(1)], {"realtime": 2})
    assert cap.reservations(0) == {}
    assert cap.fits(0, "interactive", 1) == 1 and cap.fits(0, "realtime", 1) == 1
    ctl = AdmissionController(make_policy(1, reserved={"realtime": 2}), rng=random.Random(0))
    d = ctl.arrive(ticket("batch"), 0.0)
    assert isinstance(d, Admit)  # before: refused by the policy check; with the rule gone, it must not starve


def test_reservations_apply_as_written_while_one_unit_is_left_and_scale_below():
    assert Capacity([FixedLimit(3)], {"realtime": 2}).reservations(0) == {"realtime": 2}
    assert Capacity([FixedLimit(2)], {"realtime": 2}).reservations(0) == {"realtime": 1}
    assert Capacity([FixedLimit(5)], {"realtime": 4, "batch": 4}).reservations(0) == {"realtime": 2, "batch": 2}


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.dictionaries(st.sampled_from(["realtime", "interactive", "batch"]), st.integers(0, 8), max_size=3),
    st.lists(st.tuples(st.sampled_from(["realtime", "interactive", "batch"]), st.booleans()), max_size=40),
)
def test_any_reservation_keeps_the_limit_and_leaves_every_class_a_way_in(limit, reserved, ops):
    ctl = AdmissionController(make_policy(limit, reserved=reserved), rng=random.Random(0))
    leases, now = [], 0.0
    for klass, finish in ops:
        now += 0.01
        if finish and leases:
            woken = ctl.release(leases.pop(0), now, Outcome.SUCCESS, 10.0)
        else:
            d = ctl.arrive(ticket(klass), now)
            woken = [d] if isinstance(d, Admit) else []
            woken += ctl.take_woken()
        leases += [w.lease for w in woken if isinstance(w, Admit)]
        cap = ctl.capacity
        assert cap.used[0] <= cap.limit(0)
        assert sum(cap.reservations(0).values()) <= max(0, cap.limit(0) - 1)
    while leases:  # everything queued is served in the end, whatever the reservations
        now += 0.01
        woken = ctl.release(leases.pop(0), now, Outcome.SUCCESS, 10.0)
        leases += [w.lease for w in woken if isinstance(w, Admit)]
    assert len(ctl.waitline) == 0


@given(
    st.integers(0, 6),
    st.floats(0.0, 1.5),
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 4), st.booleans(), st.booleans()), max_size=30),
)
def test_without_reservations_the_fast_fit_charges_what_the_general_rule_does(limit, factor, ops):
    """Capacity.fits with nothing reserved skips the reservation arithmetic; every answer equals
    `_fits_reserved`'s (the general rule) over any history of takes and gives."""
    cap = Capacity([FixedLimit(max(1, limit))], {})
    cap.factors[0] = factor  # a ramp or a not-ready upstream (limit 0)
    held: list[tuple[str, int]] = []
    for klass, units, reserve_only, give in ops:
        if give and held:
            cap.give(0, *held.pop())
            continue
        charge = cap.fits(0, klass, units, reserve_only)
        assert charge == cap._fits_reserved(0, klass, units, reserve_only)
        if charge is not None:
            cap.take(0, klass, charge)
            held.append((klass, charge))
