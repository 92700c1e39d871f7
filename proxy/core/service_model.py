"""Service time learned online per route: expected_ms = a + b*prompt + c*output.

Theory of operation: weighted least squares with exponential forgetting
(lambda = 1 - 1/memory_samples) fits theta = (a, b, c) to observed
(prompt_tokens, output_tokens, ms) samples in O(1) per sample, without numpy:
it keeps the decayed sums R = sum w x x^T and r = sum w x ms (x = (1, prompt,
output), tokens in thousands) and solves the 3x3 system by Cramer's rule, once per
SOLVE_EVERY samples past warm-up (the sums take each one; `flush()` solves now). The
fit is on relative error: w = (typical ms / fitted ms)^2, because service noise
is multiplicative and SJF orders by ratio, so a 50 ms request must be predicted
as well as a 50 s one. The fitted ms in w is held within 2x of the observation,
so a bad fit on the way from bad priors cannot skew the weights.
Robustness: each sample is also Huber-weighted, k*scale/|r| once its relative
residual r passes k times a robust scale (a decayed mean of clipped |r|), so
one 60 s stall moves the fit little, while a real drift (all samples off) still
wins within a few memory lengths. The first `warmup_samples` are not
down-weighted, so that bad priors are left behind fast.

Prior strength: the priors (route base_ms, ms_per_prompt_token,
ms_per_output_token) count as `prior_samples` samples LIKE THE RECENT ONES, in
every direction: Pi = prior_samples * (R + ridge * diag R) / seen (seen = the
decayed sample count), a g-prior scaled by the data itself, so its weight
follows the typical feature magnitudes. The former P0 = I / prior_samples (plus
a wind-up cap at P0) was worth thousands of samples on the token slopes, where
a sample adds only w * x^2 << 1 (measured: 18 vs a true 7 ms/token after 3,000
samples). Now the data outweighs the priors as memory_samples / prior_samples
(a 1% pull toward them by default), and directions that no sample excites (all
prompts one length; an embeddings route's output) keep the priors, through the
ridge and a one-token floor: no wind-up, no guard needed.

At arrival only the requested output (max_tokens) is known, while the fit is on
generated tokens; `OutputFill` (generated / requested) bridges the two:
expected_ms(prompt, requested) uses c * fill(requested) * requested. The ratio
is kept per power-of-two bucket of requested tokens, because short requests run
to their end while long ones stop early (one route-wide ratio overestimated
long answers ~2.2x); an empty bucket answers the route-wide ratio, which also
primes it as one pseudo-sample.

Physical ranges (issue 12: on vLLM the fit came out at -0.09 ms per prompt
token, and a base cost of 56-63 ms absorbed what the slope gave away): the
solution is held to 0 <= per-token slopes, 0 <= base <= the fastest recent
sample (no request takes less than the fixed cost), by the active-set method:
a coefficient past its bound is fixed there and the rest re-solved, at most
three rounds. The unconstrained solve is the usual case and stays as cheap.

Requests that did not finish (cut at their deadline, client gone) are censored
samples, kept apart in `proxy.core.censored.CensoredFloors`: a floor per request
shape under `expected_ms(..., now)`, so a deadline the backend cannot meet turns
into deadline_unmeetable at arrival after a cut or two, however few requests
ever complete. A model is `judged` once it has one completed sample, one
informative cut or one warm-up probe (`seed`): before that its priors are
guesses, and the controller forwards one request of the route at a time.

Pure arithmetic; `statistics()` reports coefficients, fill ratios, samples and
the decayed mean absolute relative error of arrival-time predictions.
"""

from __future__ import annotations

from math import isfinite
from typing import TYPE_CHECKING, Any

from proxy.core.censored import CensoredFloors, shape_bucket

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


_SCALE = 1000.0  # tokens per feature unit
_MIN_MS = 0.1
_MIN_SQ = 1.0 / (_SCALE * _SCALE)  # floor of a typical x_i^2 (one token) in the prior
_RIDGE = 0.1  # prior share on each coefficient alone: directions no sample excites keep it
SOLVE_EVERY = 16  # completed samples per solve of theta, past warm-up (see ServiceModel.observe)
_BUCKETS = 48  # requested-token buckets by bit length; larger requests share the last


class OutputFill:
    """Generated / requested output tokens: route-wide and per power-of-two bucket of requested
    tokens (decayed means; invariant: every ratio stays in [0, 1] once it has samples)."""

    __slots__ = ("_alpha", "_count", "_ratio", "route")

    def __init__(self, prior: float, alpha: float) -> None:
        self.route = float(prior)
        self._alpha = alpha
        self._ratio = [0.0] * _BUCKETS
        self._count = [0] * _BUCKETS

    def observe(self, requested: int, generated: int) -> None:
        if requested <= 0:  # nothing requested: no information
            return
        r = min(1.0, max(0.0, generated / requested))
        self.route += self._alpha * (r - self.route)
        i = min(requested.bit_length(), _BUCKETS - 1)
        n = self._count[i] = self._count[i] + 1
        old = self._ratio[i] if n > 1 else self.route
        # 1/(n+1): the route ratio counts as one pseudo-sample, then a plain mean, then decay
        self._ratio[i] = old + max(self._alpha, 1.0 / (n + 1)) * (r - old)

    def ratio(self, requested: float | None = None) -> float:
        if requested is None or requested < 1:
            return self.route
        i = min(int(requested).bit_length(), _BUCKETS - 1)
        return self._ratio[i] if self._count[i] else self.route

    def statistics(self) -> dict[int, float]:
        """{lowest requested tokens of the bucket: ratio} for buckets with samples."""
        return {1 << (i - 1): r for i, (r, n) in enumerate(zip(self._ratio, self._count, strict=False)) if n}


class ServiceModel:
    __slots__ = (
        "_R",
        "_alpha",
        "_k",
        "_lam",
        "_n0",
        "_prior",
        "_r",
        "_ref",
        "_scale",
        "_seen",
        "_theta",
        "_min_ms",
        "_pending",
        "_warmup",
        "error",
        "fill",
        "floors",
        "samples",
        "seeded",
    )

    def __init__(
        self,
        base_ms: float,
        ms_per_prompt_token: float,
        ms_per_output_token: float,
        output_fill_ratio: float = 1.0,
        *,
        memory_samples: int = 500,
        prior_samples: float = 5.0,
        huber_k: float = 2.5,
        warmup_samples: int = 20,
    ) -> None:
        self._prior = (float(base_ms), ms_per_prompt_token * _SCALE, ms_per_output_token * _SCALE)
        self._theta = list(self._prior)
        self._n0 = float(prior_samples)
        self._R = [0.0] * 6  # decayed sum of w x x^T, upper triangle 00 01 02 11 12 22
        self._r = [0.0] * 3  # decayed sum of w x ms
        self._seen = 0.0  # decayed sample count: R / seen is the typical w x x^T
        self._lam = 1.0 - 1.0 / memory_samples
        self._alpha = max(0.01, 2.0 / (memory_samples + 1))  # decay of scale, fill and error means
        self._k = huber_k
        self._scale: float | None = None  # robust scale of relative residuals
        self._ref: float | None = None  # typical service time (ms), for relative weights
        self.fill = OutputFill(output_fill_ratio, self._alpha)
        self._warmup = warmup_samples
        self.samples = 0
        self.seeded = 0  # warm-up probes taken as samples
        self.error: float | None = None  # decayed mean |observed - expected| / observed
        self._min_ms: float | None = None  # decayed minimum sample: the base cost's upper bound
        self._pending = 0  # samples folded into R and r since theta was last solved
        self.floors = CensoredFloors()

    @classmethod
    def from_route(cls, route: Any, memory_samples: int = 500, prior_samples: float = 5.0) -> ServiceModel:
        return cls(
            route.base_ms,
            route.ms_per_prompt_token,
            route.ms_per_output_token,
            route.output_fill_ratio,
            memory_samples=memory_samples,
            prior_samples=prior_samples,
        )

    # --- prediction -------------------------------------------------------

    def predict_ms(self, prompt_tokens: float, output_tokens: float) -> float:
        """Service time for a request that generates exactly `output_tokens`."""
        a, b, c = self._theta
        x1, x2 = prompt_tokens / _SCALE, output_tokens / _SCALE
        # Negative slopes are noise; a longer request never predicts shorter.
        return max(_MIN_MS, a + max(0.0, b) * x1 + max(0.0, c) * x2)

    def expected_ms(self, prompt_tokens: int, requested_output_tokens: int, now: float | None = None) -> float:
        """Service time expected at arrival, when only max_tokens is known; with `now`, never
        below what requests of the same shape that were cut have shown (censored floors)."""
        fill = self.fill.ratio(requested_output_tokens)
        ms = self.predict_ms(prompt_tokens, requested_output_tokens * fill)
        if now is None or not self.floors.informative:  # no cut ever taught a floor: none to look up
            return ms
        return max(ms, self.floors.floor_ms(shape_bucket(prompt_tokens, requested_output_tokens), now))

    @property
    def judged(self) -> bool:
        """Whether anything but the priors speaks: a completed sample, an informative cut, a probe."""
        return self.samples > 0 or self.floors.informative > 0

    def observe_censored(self, prompt_tokens: int, requested_output_tokens: int, cut_ms: float, now: float) -> bool:
        """A request cut after `cut_ms` upstream (service > cut_ms); True when it taught something."""
        predicted = self.expected_ms(prompt_tokens, requested_output_tokens)
        return self.floors.censored(shape_bucket(prompt_tokens, requested_output_tokens), cut_ms, predicted, now)

    # --- learning ---------------------------------------------------------

    def observe(self, prompt_tokens: int, output_tokens: int, ms: float, expected_ms: float | None = None) -> None:
        """One completed request; `expected_ms` is what was predicted at its arrival (for the error)."""
        predicted = expected_ms if expected_ms is not None else self.predict_ms(prompt_tokens, output_tokens)
        rel = abs(ms - predicted) / max(ms, _MIN_MS)
        self.error = rel if self.error is None else self.error + self._alpha * (rel - self.error)
        theta = self._theta
        x1, x2 = prompt_tokens / _SCALE, output_tokens / _SCALE
        raw = theta[0] + theta[1] * x1 + theta[2] * x2
        # The fit as the scale of the weights is held within 2x of the observation: on the
        # way from bad priors (a negative intercept, say) a bad fit must neither give short
        # samples 10^4 times the weight nor make them all look like outliers.
        fit = max(_MIN_MS, min(max(raw, 0.5 * ms), 2.0 * ms))
        w = self._relative_weight(fit, ms) * self._huber_weight(abs(ms - fit) / fit)
        lam, R, r = self._lam, self._R, self._r
        w1, w2 = w * x1, w * x2
        R[0], R[1], R[2] = lam * R[0] + w, lam * R[1] + w1, lam * R[2] + w2
        R[3], R[4], R[5] = lam * R[3] + w1 * x1, lam * R[4] + w1 * x2, lam * R[5] + w2 * x2
        r[0], r[1], r[2] = lam * r[0] + w * ms, lam * r[1] + w1 * ms, lam * r[2] + w2 * ms
        self._seen = lam * self._seen + 1.0
        m = self._min_ms
        # The fastest recent request: old minima fade toward the typical time, so a drift up is followed.
        self._min_ms = ms if m is None else min(ms, m + self._alpha * (self._ref - m))  # type: ignore[operator]
        self.samples += 1
        self._pending += 1
        # Batched: the sums take every sample, theta is re-solved once per SOLVE_EVERY of them (each
        # warm-up sample while priors are being left behind). The solve was ~20% of the core's CPU per
        # request (issue 16); a theta SOLVE_EVERY samples stale is 3% of a 500-sample memory.
        if self._pending >= SOLVE_EVERY or self.samples <= self._warmup:
            self._solve()

    def observe_many(self, samples: Sequence[tuple[int, int, float, float | None]]) -> None:
        """`observe(prompt, output, ms, expected_ms)` for each sample in order, in one loop: the same
        arithmetic in the same order (so the same state, bit for bit), without three method calls and
        the attribute reads per sample (the controller folds its completions in batches, issue 16)."""
        lam, alpha, R, r, theta, k = self._lam, self._alpha, self._R, self._r, self._theta, self._k
        for prompt_tokens, output_tokens, ms, expected_ms in samples:
            x1, x2 = prompt_tokens / _SCALE, output_tokens / _SCALE
            predicted = (
                expected_ms
                if expected_ms is not None
                else max(_MIN_MS, theta[0] + max(0.0, theta[1]) * x1 + max(0.0, theta[2]) * x2)
            )
            rel = abs(ms - predicted) / max(ms, _MIN_MS)
            self.error = rel if self.error is None else self.error + alpha * (rel - self.error)
            raw = theta[0] + theta[1] * x1 + theta[2] * x2
            fit = max(_MIN_MS, min(max(raw, 0.5 * ms), 2.0 * ms))
            ref = self._ref  # _relative_weight, inlined
            ref = self._ref = ms if ref is None else ref + alpha * (min(ms, 3.0 * ref) - ref)
            w = min(1e4, max(1e-4, (ref / fit) ** 2))
            residual = abs(ms - fit) / fit  # _huber_weight, inlined
            scale = self._scale
            if scale is None:
                self._scale = max(residual, 1e-3)
            else:
                limit = k * 1.25 * scale
                self._scale = max(1e-3, scale + alpha * (min(residual, 3.0 * scale) - scale))
                if not (self.samples < self._warmup or residual <= limit):
                    w *= limit / residual
            w1, w2 = w * x1, w * x2
            R[0], R[1], R[2] = lam * R[0] + w, lam * R[1] + w1, lam * R[2] + w2
            R[3], R[4], R[5] = lam * R[3] + w1 * x1, lam * R[4] + w1 * x2, lam * R[5] + w2 * x2
            r[0], r[1], r[2] = lam * r[0] + w * ms, lam * r[1] + w1 * ms, lam * r[2] + w2 * ms
            self._seen = lam * self._seen + 1.0
            m = self._min_ms
            self._min_ms = ms if m is None else min(ms, m + alpha * (ref - m))
            self.samples += 1
            self._pending += 1
            if self._pending >= SOLVE_EVERY or self.samples <= self._warmup:
                self._solve()

    def flush(self) -> None:
        """Solve for the samples taken since the last solve (introspection reads a current fit)."""
        if self._pending:
            self._solve()

    def _solve(self) -> None:
        """theta = (R + Pi)^-1 (r + Pi prior), Pi = prior_samples * (R + ridge * diag R) / seen
        (see the module doc); invariant: Pi is positive definite, so the system always solves."""
        self._pending = 0
        R, r, p = self._R, self._r, self._prior
        k = self._n0 / self._seen
        kr = k * _RIDGE
        r0, r1, r2, r3, r4, r5 = R
        floor = _MIN_SQ * r0
        q0, q1, q2, q3, q4, q5 = k * r0, k * r1, k * r2, k * r3, k * r4, k * r5
        q0 += kr * r0
        q3 += kr * max(floor, r3)
        q5 += kr * max(floor, r5)
        a, b, c, d, e, f = r0 + q0, r1 + q1, r2 + q2, r3 + q3, r4 + q4, r5 + q5
        y0 = r[0] + q0 * p[0] + q1 * p[1] + q2 * p[2]
        y1 = r[1] + q1 * p[0] + q3 * p[1] + q4 * p[2]
        y2 = r[2] + q2 * p[0] + q4 * p[1] + q5 * p[2]
        c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
        c11, c12, c22 = a * f - c * c, b * c - a * e, a * d - b * b
        det = a * c00 + b * c01 + c * c02
        if not det > 0.0:  # only rounding can do this (the prior is positive definite): keep theta
            return
        t0 = (c00 * y0 + c01 * y1 + c02 * y2) / det
        t1 = (c01 * y0 + c11 * y1 + c12 * y2) / det
        t2 = (c02 * y0 + c12 * y1 + c22 * y2) / det
        if not (isfinite(t0) and isfinite(t1) and isfinite(t2)):
            return
        hi = self._min_ms if self._min_ms is not None else float("inf")
        if t1 < 0.0 or t2 < 0.0 or t0 < 0.0 or t0 > hi:
            solved = _bounded(((a, b, c), (b, d, e), (c, e, f)), (y0, y1, y2), [t0, t1, t2], hi)
            if solved is None:
                return
            t0, t1, t2 = solved
        self._theta[:] = (t0, t1, t2)

    def _relative_weight(self, fit: float, ms: float) -> float:
        """(typical / fit)^2: least squares on relative error, so a 50 ms request counts as
        much as a 50 s one (service noise is multiplicative, and SJF orders by ratio)."""
        ref = self._ref
        self._ref = ms if ref is None else ref + self._alpha * (min(ms, 3.0 * ref) - ref)
        return min(1e4, max(1e-4, (self._ref / fit) ** 2))

    def observe_output(self, requested_tokens: int, generated_tokens: int) -> None:
        """Generated vs requested output of one request (from the response's usage)."""
        self.fill.observe(requested_tokens, generated_tokens)

    def _huber_weight(self, rel_residual: float) -> float:
        scale = self._scale
        if scale is None:
            self._scale = max(rel_residual, 1e-3)
            return 1.0
        limit = self._k * 1.25 * scale  # 1.25 * mean |r| ~ standard deviation for normal noise
        self._scale = max(1e-3, scale + self._alpha * (min(rel_residual, 3.0 * scale) - scale))
        if self.samples < self._warmup or rel_residual <= limit:
            return 1.0
        return limit / rel_residual

    # --- introspection ----------------------------------------------------

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """(base_ms, ms_per_prompt_token, ms_per_output_token)."""
        self.flush()
        a, b, c = self._theta
        return a, b / _SCALE, c / _SCALE

    @property
    def output_fill_ratio(self) -> float:
        """Route-wide generated / requested ratio (`fill.ratio(requested)` for one size)."""
        return self.fill.route

    def statistics(self) -> dict[str, Any]:
        a, b, c = self.coefficients
        # What predict_ms computes with, not the raw fit: a negative slope counts as 0 there.
        return {
            "base_ms": a,
            "ms_per_prompt_token": max(0.0, b),
            "ms_per_output_token": max(0.0, c),
            "output_fill_ratio": self.fill.route,
            "output_fill_ratio_by_requested": self.fill.statistics(),
            "samples": self.samples,
            "seeded_samples": self.seeded,
            "judged": self.judged,
            "mean_abs_relative_error": self.error,
        }

    def __repr__(self) -> str:
        a, b, c = self.coefficients
        return (
            f"<ServiceModel {a:.1f} + {b:.4f}*prompt + {c:.3f}*output ms, fill={self.fill.route:.2f}, n={self.samples}>"
        )


def _bounded(
    m: Sequence[Sequence[float]], y: Sequence[float], theta: list[float], base_max: float
) -> tuple[float, float, float] | None:
    """Least squares theta with 0 <= theta[1], theta[2] and 0 <= theta[0] <= base_max: fix each
    coefficient past its bound at the bound, re-solve the others (active set, <= 3 rounds)."""
    lo, hi = (0.0, 0.0, 0.0), (base_max, float("inf"), float("inf"))
    fixed: dict[int, float] = {}
    for _ in range(3):
        for i in range(3):
            if i not in fixed and not lo[i] <= theta[i] <= hi[i]:
                fixed[i] = min(max(theta[i], lo[i]), hi[i])
        free = [i for i in range(3) if i not in fixed]
        if len(free) == 3:
            break
        rhs = [y[i] - sum(m[i][j] * v for j, v in fixed.items()) for i in free]
        sub = _solve_small([[m[i][j] for j in free] for i in free], rhs)
        if sub is None:
            return None
        theta = [fixed.get(i, 0.0) for i in range(3)]
        for i, v in zip(free, sub, strict=True):
            theta[i] = v
        if all(lo[i] <= theta[i] <= hi[i] for i in free):
            break
    else:
        theta = [min(max(theta[i], lo[i]), hi[i]) for i in range(3)]
    return theta[0], theta[1], theta[2]


def _solve_small(m: list[list[float]], y: list[float]) -> list[float] | None:
    """Solve a 0x0, 1x1 or 2x2 system (Cramer); None when singular."""
    if not m:
        return []
    if len(m) == 1:
        return [y[0] / m[0][0]] if m[0][0] > 0.0 else None
    (p, q), (r, s) = m
    det = p * s - q * r
    if not det > 0.0:
        return None
    return [(s * y[0] - q * y[1]) / det, (p * y[1] - r * y[0]) / det]


class ServiceModels:
    """One `ServiceModel` per route (keyed by path_prefix), kept across reloads
    unless the route's priors or the model settings change."""

    __slots__ = ("_models", "_routes", "_settings", "settled")

    def __init__(self) -> None:
        self._models: dict[str, ServiceModel] = {}
        self._routes: dict[str, object] = {}
        self._settings: tuple[int, float] | None = None
        # Routes whose model is past warm-up and was never taught a censored floor: for them
        # judged() is True, warming(), floored() and probe() are False and floor_ms() is 0, which the
        # controller reads from this set on its per-request path instead of asking (issue 16).
        self.settled: set[str] = set()

    def _track(self, route: str, model: ServiceModel) -> None:
        """Keep `settled` true to the model's state after it learned or was cut."""
        if model.samples > 0 and model.samples >= model._warmup and not model.floors.informative:
            self.settled.add(route)
        else:
            self.settled.discard(route)

    def configure(self, routes: Iterable[Any], memory_samples: int, prior_samples: float) -> None:
        settings = (memory_samples, prior_samples)
        models = {}
        for route in routes:
            key = route.path_prefix
            keep = settings == self._settings and self._routes.get(key) == route and key in self._models
            models[key] = self._models[key] if keep else ServiceModel.from_route(route, *settings)
        self._models, self._settings = models, settings
        self._routes = {r.path_prefix: r for r in routes}
        self.settled = set()
        for key, model in models.items():
            self._track(key, model)

    def expected_ms(
        self, route: str, prompt_tokens: int, requested_output_tokens: int, fallback: float, now: float | None = None
    ) -> float:
        model = self._models.get(route)
        return fallback if model is None else model.expected_ms(prompt_tokens, requested_output_tokens, now)

    def floor_ms(
        self, route: str, prompt_tokens: int, requested_output_tokens: int, now: float, ticket_id: int = 0
    ) -> float:
        """The censored floor for this shape now (0 when nothing was cut, or for the probe `ticket_id`)."""
        model = self._models.get(route)
        if model is None or not model.floors.informative:  # floors exist only once a cut taught one
            return 0.0
        return model.floors.floor_ms(shape_bucket(prompt_tokens, requested_output_tokens), now, ticket_id)

    def probe(
        self, route: str, prompt_tokens: int, requested_output_tokens: int, ticket_id: int, deadline: float, now: float
    ) -> bool:
        """Whether ticket `ticket_id` goes as its shape's probe: a floor from cuts alone condemns it and
        the model without the floor does not (proxy/core/censored.py); it is then judged without it."""
        model = self._models.get(route)
        if model is None or not model.floors.informative:
            return False
        estimate = model.expected_ms(prompt_tokens, requested_output_tokens)
        key = shape_bucket(prompt_tokens, requested_output_tokens)
        return model.floors.probe(key, ticket_id, (deadline - now) * 1000.0, estimate, now)

    def floored(self, route: str, prompt_tokens: int, requested_output_tokens: int) -> bool:
        """Whether a floor from cuts alone stands on this shape (an answer of it is folded at once)."""
        model = self._models.get(route)
        if model is None or not model.floors.informative:
            return False
        return model.floors.standing(shape_bucket(prompt_tokens, requested_output_tokens))

    def warming(self, route: str) -> bool:
        """Whether the route's model is still in warm-up (each sample solved at once: priors are being
        left behind, so a batched sample would leave the next arrivals on the priors)."""
        model = self._models.get(route)
        return model is not None and model.samples < model._warmup

    def judged(self, route: str) -> bool:
        """Whether the route's model has more than priors to go on (unknown routes: judged)."""
        model = self._models.get(route)
        return model is None or model.judged

    def censored(self, route: str, prompt_tokens: int, requested_output_tokens: int, cut_ms: float, now: float) -> bool:
        """A request cut after `cut_ms` upstream; True when it raised a floor."""
        model = self._models.get(route)
        if model is None or not model.observe_censored(prompt_tokens, requested_output_tokens, cut_ms, now):
            return False
        self._track(route, model)
        return True

    def seed(self, route: str, prompt_tokens: int, requested_output_tokens: int, ms: float, now: float) -> None:
        """A warm-up probe of this shape took `ms`: a sample before any real traffic."""
        model = self._models.get(route)
        if model is None:
            return
        self.learn(
            route,
            prompt_tokens,
            requested_output_tokens,
            model.expected_ms(prompt_tokens, requested_output_tokens),
            ms,
            now=now,
        )
        model.seeded += 1

    def fill(self, route: str, requested_output_tokens: int | None = None) -> float:
        """Learned generated / requested output ratio for `route` (1.0 if unknown), for
        requests of `requested_output_tokens` (route-wide when None)."""
        model = self._models.get(route)
        return 1.0 if model is None else model.fill.ratio(requested_output_tokens)

    def learn(
        self,
        route: str,
        prompt_tokens: int,
        requested_output_tokens: int,
        expected_ms: float,
        ms: float,
        observed_prompt: int | None = None,
        observed_output: int | None = None,
        now: float | None = None,
    ) -> None:
        """A finished request: the estimate made at arrival, and what the upstream reported."""
        model = self._models.get(route)
        if model is None:  # its route went away in a reload
            return
        prompt = prompt_tokens if observed_prompt is None else observed_prompt
        if observed_output is not None:
            model.observe_output(requested_output_tokens, observed_output)
            output = observed_output
        else:  # unknown: assume the usual share of what was asked for
            output = round(requested_output_tokens * model.fill.ratio(requested_output_tokens))
        model.observe(prompt, output, ms, expected_ms)
        if now is not None and model.floors.informative:  # else there is no floor to fade
            model.floors.completed(shape_bucket(prompt_tokens, requested_output_tokens), ms, now)
        self._track(route, model)

    def learn_many(
        self, samples: Sequence[tuple[str, int, int, float, float, int | None, int | None, float | None]]
    ) -> None:
        """`learn(*sample)` for each sample in order (the same result): the output fill and floors per
        sample, then each route's model takes its samples in one `observe_many` loop (the fill is not
        read by `observe`, so the order between them does not matter)."""
        per_model: dict[str, list[tuple[int, int, float, float | None]]] = {}
        models = self._models
        for route, prompt_tokens, requested, expected_ms, ms, observed_prompt, observed_output, now in samples:
            model = models.get(route)
            if model is None:  # its route went away in a reload
                continue
            prompt = prompt_tokens if observed_prompt is None else observed_prompt
            if observed_output is not None:
                model.fill.observe(requested, observed_output)
                output = observed_output
            else:
                output = round(requested * model.fill.ratio(requested))
            batch = per_model.get(route)
            if batch is None:
                batch = per_model[route] = []
            batch.append((prompt, output, ms, expected_ms))
            if now is not None and model.floors.informative:
                model.floors.completed(shape_bucket(prompt_tokens, requested), ms, now)
        for route, batch in per_model.items():
            model = models[route]
            model.observe_many(batch)
            self._track(route, model)

    def statistics(self, now: float | None = None) -> dict[str, Any]:
        out = {}
        for route, m in self._models.items():
            out[route] = stats = m.statistics()
            if now is not None:
                stats["censored"] = m.floors.statistics(now)
        return out

    def __repr__(self) -> str:
        return f"<ServiceModels {list(self._models)}>"
