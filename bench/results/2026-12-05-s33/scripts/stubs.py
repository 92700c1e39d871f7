"""The policy path's chunks at their floors: `apply(names)` replaces each named chunk, in this process,
by the least that keeps a request going, so the CPU it no longer takes is what that chunk costs.

- classify: the first request's ticket per path, copied with a fresh id and deadline (no header rules,
  no cost estimate, no service-time model);
- admit: admission a counter, up on arrival and down on release (no limit, gate, CoDel, load estimator,
  leases, samples, learning or admission metrics);
- observe: the observatory records nothing and its timeout hint is the first one per key;
- notes: the edge's per-request record (note_ticket / note_admitted / note_service) left empty;
- ready: readiness hears no results;
- nogc: the cyclic collector off (reference counting still frees);
admission's parts, one at a time (its common case otherwise as built):
- inst: the admission metrics (_Instruments.admitted / released) do nothing;
- load: the load estimator's per-request accepted / released do nothing;
- gate: the arrival gate's quiet pass always passes and its CoDel dequeue does nothing;
- svc: service_ms is the ticket's expected time (no p99 read, no censored floor);
- fold: samples are dropped unlearned.
Measuring aids only, never a configuration: a stubbed sidecar admits everything."""
import itertools
from proxy.core.decisions import Lease, Ticket
from proxy.core import admission, arrival, load
from proxy.runtime import edge, observe, readiness, request_path, scheduler


def apply(v):
    if "classify" in v:  # a ticket copied from the first one's template (id, deadline fresh)
        real, memo, ids = request_path.classify, {}, itertools.count(10**9)
        def classify(path, fields, body, now, sched, policy):
            t = memo.get(path)
            if t is None:
                t = memo[path] = real(path, fields, body, now, sched, policy)
            return Ticket(next(ids), t.klass, t.cost, t.expected_ms, now + t.budget_ms / 1000.0, t.budget_ms, t.tenant)
        request_path.classify = classify
    if "admit" in v:  # admission a counter: up on arrival, down on release
        lids, used = itertools.count(10**9), [0]
        def arrive(self, ticket, now):
            used[0] += 1
            return scheduler.Slot(self, Lease(next(lids), ticket, 0, 1, now, 0.0, 1.0), None)
        def finished(self, r):
            self._done = True
            used[0] -= 1
        scheduler.Scheduler.arrive = arrive
        scheduler.Slot.finished = finished
    if "observe" in v:
        observe.Observatory.record = lambda *a, **k: None
        cached = {}
        real_hint = observe.Observatory.hint_fields
        def hint_fields(self, key, now, fallback):
            h = cached.get(key)
            if h is None:
                h = cached[key] = real_hint(self, key, now, fallback)
            return h
        observe.Observatory.hint_fields = hint_fields
    if "notes" in v:
        for name in ("note_ticket", "note_admitted", "note_service"):
            setattr(edge, name, lambda *a, **k: None)
    if "ready" in v:
        readiness.UpstreamLifecycles.report_result = lambda *a, **k: None
    if "nogc" in v:  # no cyclic collector passes at all (reference counting still frees)
        import gc
        gc.disable()
    if "inst" in v:
        scheduler._Instruments.released = lambda *a, **k: None
        scheduler._Instruments.admitted = lambda *a, **k: None
    if "load" in v:
        load.LoadEstimator.accepted = lambda *a, **k: None
        load.LoadEstimator.released = lambda *a, **k: None
    if "gate" in v:
        arrival.ArrivalGate.passes_at_once = lambda *a, **k: True
        arrival.ArrivalGate.dequeued = lambda *a, **k: None
    if "svc" in v:
        admission.AdmissionController.service_ms = lambda self, t, now: t.expected_ms
    if "fold" in v:
        admission.AdmissionController._fold = lambda self, learn_last=False: self._samples.clear()
