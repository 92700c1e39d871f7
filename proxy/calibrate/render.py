"""A `Calibration` as a policy file: every measured value on its own line, commented with its figure.

Theory of operation: `policy_toml(cal)` writes the tables calibration has
figures for and nothing else (every other key keeps its documented default):

- `[[upstreams]]`: the URL, timeout_s from the slowest request alone, and
  `stops_on_cancel` from the cancel trials ("auto" when they disagreed);
- `[warmup]`: the health path discovery found (pinned), and one probe of the
  short shape, so warm-up measures it again at every start;
- `[limits]`: the knee of the concurrency sweep as a fixed limit in requests, or
  `kind = "engine_queue"` where the server exports its queue, starting at the
  engine's batch and bounded by `fit.engine_queue_ceiling`, with `[gpu]`
  reading the gauges every `fit.metrics_interval_s`;
- `[scheduling]`, `[classes.*]`: SJF, and class budgets in turns (`fit.budgets`)
  of the slowest request measured, under load where it was (`fit.turn`), or of a
  quarter of the default class's budget where it is fixed by hand (`budget_ms`);
  each class's max_queue_length is what the server answers within that budget at
  the knee (`queue_length`), so the cap sheds no queue the backend would drain in
  time (the schema's defaults, 64 / 256 / 1,024, are counts: at 2x offered, vLLM
  on CPU answered a queue of ~250 within a 10 s budget while the sidecar turned
  15-20 % away as class_queue_full, 2026-12-04-s27), and its max_queue_wait_ms
  the budget itself: the bound in the server's terms (scheduling.fcfs_wait_multiple)
  acts first, where half a budget made SJF FCFS under any standing queue (s28);
- `[[routes]]`: one per route found, its priors fitted from the medians alone,
  chars_per_token and output_fill_ratio from the server's usage where reported,
  and a catch-all;
- `[shedding]`: CoDel's target at what a default-class request can wait and
  still meet its budget, its interval at the budget, so a queue the backend
  drains within deadlines is not shed; max_queued_requests at the memory bound
  (`QUEUE_LENGTH_CAP`), above the classes' own caps.

Keys a newer or older rampmeter lacks (`stops_on_cancel`, `engine_queue`) are
written only when this rampmeter's schema accepts them, else as a comment saying
what was measured; `check_policy` proves the text loads as `rampmeter policy
check` would load it. Pure: text in, text out.
"""

from __future__ import annotations

import datetime
import math
import textwrap

import msgspec

from proxy.calibrate.fit import (
    CLASS_TURNS,
    DEFAULT_CLASS,
    METRICS_INTERVAL_S,
    at_limit,
    budgets,
    engine_queue_ceiling,
    metrics_interval_s,
    round_up,
)
from proxy.calibrate.measure import CANCEL_AT, Calibration, RouteCalibration
from proxy.policy.admission import ClassPolicy, Limits, default_classes
from proxy.policy.load import parse_policy
from proxy.policy.schema import Policy, Upstream

# A class's max_queue_length is never written above this: the default max_connections, past which only
# HTTP/2 streams could queue, each holding its request in memory (docs/security.md).
QUEUE_LENGTH_CAP = 4096
ON_UNMEETABLE = {"realtime": "reject", "interactive": "reject", "batch": "try"}
PRIORITY = {"realtime": 0, "interactive": 1, "batch": 2}


def supports(section: type, **fields) -> bool:
    """Whether this rampmeter's schema accepts `fields` in `section` (a key or value added on another branch)."""
    base = {"url": "http://127.0.0.1:1"} if section is Upstream else {}
    try:
        msgspec.convert(base | fields, section)
    except msgspec.ValidationError:
        return False
    return True


def policy_toml(
    cal: Calibration, *, command: str = "", when: datetime.datetime | None = None, budget_ms: int | None = None
) -> str:
    """The commented policy; `budget_ms` fixes the default class's budget by hand (the other classes,
    CoDel's target and interval follow it as they follow a measured one)."""
    when = when or datetime.datetime.now(datetime.UTC)
    out: list[str] = []
    add = out.append
    turn = cal.turn_ms if budget_ms is None else budget_ms / CLASS_TURNS[DEFAULT_CLASS]
    budget = budgets(turn, budget_ms)
    how = cal.turn[1] if budget_ms is None else f"default budget fixed by hand at {budget_ms} ms (--budget-ms)"
    add(f"# rampmeter policy written by `{command or 'rampmeter calibrate ' + cal.url}`")
    add(f"# on {when:%Y-%m-%d %H:%M} UTC after {cal.duration_s:.0f} s of probing. Every value below was measured")
    add("# against that server, and its comment says from what; keys not written keep their defaults")
    add("# (docs/policy-reference.md). Calibrate again after changing the model, hardware or server settings.")
    add("# Check: rampmeter policy check FILE")
    for note in cal.notes:
        add(f"# NOTE: {note}")
    add("")
    _upstream(add, cal)
    _warmup(add, cal)
    _scheduling(add, cal, turn, budget, how)
    for route in cal.routes:
        _route(add, route)
    add("[[routes]]")
    add("# Everything else (/health, /v1/models, ...): one token; bodies of a known shape are costed by it.")
    add('path_prefix = "/"')
    add('kind = "fixed"')
    add("# ms: not measured (metadata calls); a small prior the model corrects.")
    add("base_ms = 5.0")
    add("")
    _limits(add, cal)
    _shedding(add, cal, turn, budget)
    return "\n".join(out).rstrip() + "\n"


def _upstream(add, cal: Calibration) -> None:
    slowest = max((s for r in cal.routes for s in r.shapes), key=lambda s: s.p50_ms)
    longest = max(slowest.p50_ms, cal.long_alone_ms)
    add("[[upstreams]]")
    add(f'url = "{cal.url}"')
    add('protocol = "http1"')
    add(f"# Seconds: 20 x the slowest request measured alone ({cal.long_label}: {longest:,.0f} ms), at least 60.")
    add(f"timeout_s = {max(60.0, math.ceil(20 * longest / 1000.0)):.1f}")
    verdict = {True: "stops working on a request whose client left", False: "keeps computing after a disconnect"}
    stops = cal.stops_on_cancel
    said = "undecided: learn it while serving" if stops is None else verdict[stops]
    value = '"auto"' if stops is None else ("true" if stops else "false")
    add(f"# Cancel trials: the limit's worth of {cal.long_label} requests ({cal.long_alone_ms:,.0f} ms alone),")
    add(f"# their connections closed {int(100 * CANCEL_AT)} % in; then")
    for t in cal.cancel_trials:
        add(f"#   {t.describe()}")
    add(f"# So the server {said}.")
    if supports(Upstream, stops_on_cancel=True):
        add(f"stops_on_cancel = {value}")
    else:
        add(f"# stops_on_cancel = {value}   (needs a rampmeter with [[upstreams]] stops_on_cancel)")
    add("")


def _warmup(add, cal: Calibration) -> None:
    add("[warmup]")
    for line in textwrap.wrap(f"{cal.health}; pinned, so a restart is never judged by another path.", 100):
        add(f"# {line}")
    add(f'health_path = "{cal.health_path}"')
    add("")
    s = cal.short
    body = s.body.decode()
    add("[[warmup.probes]]")
    add(f"# The short shape ({s.label}: {s.p50_ms:,.0f} ms alone); warm when its latency stops falling.")
    add(f'name = "{s.label}"')
    add(f'path = "{s.path}"')
    add(f"body = '{body}'" if "'" not in body and "\n" not in body else f"body = {msgspec.json.encode(body).decode()}")
    add("count = 8")
    add("")


def _scheduling(add, cal: Calibration, turn: float, budget: dict[str, int], how: str) -> None:
    add("[scheduling]")
    add("# Shortest expected first: the fitted priors below tell short requests from long ones.")
    add('order = "sjf"')
    add(f'default_class = "{DEFAULT_CLASS}"')
    add("")
    if cal.loaded:
        add(f"# Latency with {cal.loaded[0].concurrency} in flight (a mixed closed loop of every shape): p50, p99")
        for s in cal.loaded:
            add(f"#   {s.label:<18} {s.p50_ms:9,.0f} {s.p99_ms:9,.0f} ms, {s.samples} answers")
    if cal.long_output_tokens:
        add(
            f"# Budgets hold answers up to {cal.long_output_tokens:g} output tokens ({cal.long_label}, the longest measured);"
        )
        add("# clients that ask for longer ones should send x-request-timeout-ms, or raise default_timeout_ms.")
    add("")
    for name, turns in CLASS_TURNS.items():
        add(f"[classes.{name}]")
        add(f"priority = {PRIORITY[name]}")
        add(f"# ms: {turns:g} turns of {turn:,.0f} ms, the {how}.")
        add(f"default_timeout_ms = {min(86_400_000, budget[name])}")
        add("# ms: ten default budgets.")
        add(f"max_timeout_ms = {min(86_400_000, 10 * budget[name])}")
        add("# ms: the default budget (a request that waited it is late anyway). The starvation bound that")
        add("# acts first is scheduling.fcfs_wait_multiple, in the server's own terms: half a budget here made")
        add("# SJF plain FCFS whenever a queue stood longer than that.")
        add(f"max_queue_wait_ms = {max(1, budget[name])}")
        rps, length = cal.knee.throughput_rps, queue_length(cal, budget[name], name)
        add(f"# requests: what the server answers in the default budget at the knee ({rps:,.1f}/s), within")
        add(f"# [the schema's default, {QUEUE_LENGTH_CAP:,}]; the shedding rules judge the queue's wait below it.")
        add(f"max_queue_length = {length}")
        add(f'on_unmeetable = "{ON_UNMEETABLE[name]}"')
        add("")


def queue_length(cal: Calibration, budget_ms: int, name: str) -> int:
    """A class's max_queue_length: the answers the server gives in `budget_ms` at the knee (module doc)."""
    default = default_classes().get(name, ClassPolicy()).max_queue_length
    drained = math.ceil(cal.knee.throughput_rps * budget_ms / 1000.0)
    return min(QUEUE_LENGTH_CAP, max(default, drained))


def _route(add, route: RouteCalibration) -> None:
    e, c = route.endpoint, route.coefficients
    add("[[routes]]")
    add(f'path_prefix = "{e.path}"')
    add(f'kind = "{e.kind}"')
    add("# Median latency alone (one request at a time):")
    for s in route.shapes:
        add(f"#   {s.label.split(':', 1)[-1]:<12} {s.p50_ms:9,.1f} ms  {_tokens(s)}, {s.samples} samples")
    add("# fitted: ms = base + a * prompt + b * output, no term below 0.")
    add(f"base_ms = {c.base_ms:.3f}")
    if e.kind != "fixed":
        add(f"ms_per_prompt_token = {c.ms_per_prompt_token:.5f}")
        add(f"ms_per_output_token = {c.ms_per_output_token:.4f}")
        if route.chars_per_token is not None:
            add("# From the server's usage: prompt characters per prompt token (difference of two prompts).")
            add(f"chars_per_token = {min(100.0, max(0.1, route.chars_per_token)):.2f}")
        else:
            add("# The server reports no usage: 4 characters per token assumed.")
    else:
        add("ms_per_prompt_token = 0.0")
        add("ms_per_output_token = 0.0")
    if e.kind in ("chat", "completions"):
        add("# Output tokens when a request sets no max_tokens: not measured (the default).")
        if route.fill_ratio is not None:
            add("# Generated / requested output tokens in the server's usage.")
            add(f"output_fill_ratio = {min(1.0, max(0.01, route.fill_ratio)):.2f}")
    add("")


def _tokens(s) -> str:
    if s.kind == "fixed":
        return "the named request"
    src = "usage" if s.usage else "asked"
    return f"{s.prompt_tokens:g} prompt + {s.output_tokens:g} output tokens, {src}"


def _limits(add, cal: Calibration) -> None:
    k = cal.knee
    queue = [g for g in cal.engine_gauges if "waiting" in g or "pending" in g]
    add("[limits]")
    engine = bool(queue) and supports(Limits, kind="engine_queue")
    if engine:
        add(f"# The server exports its queue ({', '.join(queue)}): follow it, keeping it near empty.")
        add('kind = "engine_queue"')
    else:
        if queue:
            add(f"# The server exports its queue ({', '.join(queue)});")
            add('# kind = "engine_queue" (follow it) needs a newer rampmeter: a fixed limit meanwhile.')
        else:
            add("# The server exports no queue gauge: a fixed limit.")
        add('kind = "fixed"')
    add('unit = "requests"')
    add(f"# Closed-loop sweep of {cal.sweep_label}, users: throughput, p50")
    for s in cal.sweep:
        engine_seen = ""
        if s.engine_running_max is not None:
            engine_seen = f", engine running <= {s.engine_running_max:g} waiting <= {s.engine_waiting_max or 0:g}"
        add(f"#   {s.concurrency:>4}: {s.throughput_rps:8.1f}/s {s.p50_ms:9,.0f} ms{engine_seen}")
    add(f"# The knee: {k.concurrency} in flight reach {k.throughput_rps:.1f}/s, within 5 % of the best;")
    if cal.engine_batch is not None and cal.limit < k.concurrency:
        add(f"# the engine never ran more than {cal.engine_batch} at once while others waited inside it (its own")
        add(f"# batch), so the limit is {cal.limit}: the rest waits here, in SJF order, not in the engine's FCFS.")
    else:
        add("# more would only wait inside the engine, in its order rather than ours.")
    add(f"initial_limit = {cal.limit}")
    add("min_limit = 1")
    ceiling = engine_queue_ceiling(cal.sweep)
    if engine and ceiling > cal.limit:
        add("# Following the engine: what it runs, plus what its front end holds (HTTP, tokenizing, answers")
        add("# being written), plus engine_target_waiting (2) kept waiting inside it. The front end's share is")
        add(f"# found by the limit itself; the cap is twice {ceiling} (the first step with requests waiting")
        add("# inside the engine, or the knee), a bound for a server whose gauges go wrong.")
        add(f"max_limit = {2 * ceiling}")
    else:
        add(f"max_limit = {cal.limit}")
    if queue:
        add("")
        add("[gpu]")
        add(f"# Where the engine's gauges are ({', '.join(queue)}).")
        add(f'upstream_metrics_path = "{cal.metrics_path}"')
        step, (lo, hi) = at_limit(cal.sweep, cal.limit), METRICS_INTERVAL_S
        interval = metrics_interval_s(step)
        add(
            f"# Seconds: two short requests' time at {step.concurrency} users (p50 {step.p50_ms:,.0f} ms), "
            f"within {lo:g}-{hi:g} s; the"
        )
        add("# engine_queue limit follows the engine at each reading.")
        add(f"upstream_metrics_interval_s = {interval:.2f}")
    add("")


def _shedding(add, cal: Calibration, turn: float, budget: dict[str, int]) -> None:
    k = cal.knee
    interactive = budget["interactive"]
    interactive = min(600_000, interactive)
    target = max(1.0, interactive - k.p99_ms)
    add("[shedding]")
    add('rules = ["queue_length", "codel"]')
    add(f"# ms: a default-class request may wait its budget ({interactive} ms) less the p99 at the knee")
    add(f"# ({k.p99_ms:,.0f} ms) and still finish in time: a queue below that is not shed.")
    add(f"codel_target_ms = {int(target)}")
    add("# ms: one default budget.")
    add(f"codel_interval_ms = {interactive}")
    add("# requests: the memory bound over all classes (the default connection limit); the classes'")
    add("# max_queue_length and the deadline rule, in the server's own time, shed before it.")
    add(f"max_queued_requests = {QUEUE_LENGTH_CAP}")
    add(f"# ms: the p50 at the knee ({k.p50_ms:,.0f} ms): no client is told to come back sooner than that.")
    add(f"retry_after_min_ms = {min(30_000, max(1, round_up(k.p50_ms)))}")
    add("")


def check_policy(text: str) -> Policy:
    """The written text as `rampmeter policy check` loads it (raises proxy.errors.PolicyError)."""
    return parse_policy(text, "<calibrated policy>")
