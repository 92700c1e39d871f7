"""Service time learned online per route: expected_ms = a + b*prompt + c*output.

Theory of operation: recursive least squares with exponential forgetting
(lambda = 1 - 1/memory_samples) fits (a, b, c) from observed
(prompt_tokens, output_tokens, ms) samples in O(1) per sample (a 3x3 matrix),
without numpy. Features are scaled to thousands of tokens so the problem stays
well conditioned. The fit is on relative error: each sample is weighted by
(typical ms / fitted ms)^2, because service noise is multiplicative and SJF
orders by ratio, so a 50 ms request must be predicted as well as a 50 s one.
Robustness: on top, each sample is Huber-weighted, k*scale/|r| once its relative
residual r passes k times a robust scale (a decayed mean of clipped |r|), so
one 60 s stall moves the fit little, while a real drift (all samples off) still
wins within a few memory lengths.
The first `warmup_samples` are not down-weighted, so that bad priors are left
behind fast. Wind-up guard: forgetting inflates P in directions that samples do
not excite (all prompts the same length); P is scaled back whenever a diagonal
entry passes its prior value, so the model never becomes less sure than it was
before any sample.

Priors come from the policy route (base_ms, ms_per_prompt_token,
ms_per_output_token), worth `prior_samples` samples (P0 = I / prior_samples).

At arrival only the requested output (max_tokens) is known, while the fit is on
generated tokens; `output_fill_ratio` (generated / requested, decayed mean,
primed from the policy) bridges the two: expected_ms(prompt, requested) uses
c * fill * requested.

Pure arithmetic; `statistics()` reports coefficients, samples and the decayed
mean absolute relative error of arrival-time predictions.
"""

from __future__ import annotations

_SCALE = 1000.0  # tokens per feature unit
_MIN_MS = 0.1


class ServiceModel:
    __slots__ = (
        "_P",
        "_alpha",
        "_fill",
        "_k",
        "_lam",
        "_p0",
        "_ref",
        "_scale",
        "_theta",
        "_warmup",
        "error",
        "samples",
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
        self._theta = [float(base_ms), ms_per_prompt_token * _SCALE, ms_per_output_token * _SCALE]
        self._p0 = 1.0 / prior_samples
        self._P = (self._p0, 0.0, 0.0, self._p0, 0.0, self._p0)  # symmetric 3x3: a b c / d e / f
        self._lam = 1.0 - 1.0 / memory_samples
        self._alpha = max(0.01, 2.0 / (memory_samples + 1))  # decay of scale, fill and error means
        self._k = huber_k
        self._scale: float | None = None  # robust scale of relative residuals
        self._ref: float | None = None  # typical service time (ms), for relative weights
        self._fill = float(output_fill_ratio)
        self._warmup = warmup_samples
        self.samples = 0
        self.error: float | None = None  # decayed mean |observed - expected| / observed

    @classmethod
    def from_route(
        cls, route, memory_samples: int = 500, prior_samples: float = 5.0
    ) -> ServiceModel:
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

    def expected_ms(self, prompt_tokens: int, requested_output_tokens: int) -> float:
        """Service time expected at arrival, when only max_tokens is known."""
        return self.predict_ms(prompt_tokens, requested_output_tokens * self._fill)

    # --- learning ---------------------------------------------------------

    def observe(
        self, prompt_tokens: int, output_tokens: int, ms: float, expected_ms: float | None = None
    ) -> None:
        """One completed request; `expected_ms` is what was predicted at its arrival (for the error)."""
        predicted = (
            expected_ms
            if expected_ms is not None
            else self.predict_ms(prompt_tokens, output_tokens)
        )
        rel = abs(ms - predicted) / max(ms, _MIN_MS)
        self.error = rel if self.error is None else self.error + self._alpha * (rel - self.error)
        theta = self._theta
        x1, x2 = prompt_tokens / _SCALE, output_tokens / _SCALE
        fit = theta[0] + theta[1] * x1 + theta[2] * x2
        fit = max(1.0, fit)
        residual = ms - fit
        weight = self._relative_weight(fit, ms) * self._huber_weight(abs(residual) / fit)
        # Unrolled 3x3 RLS step on the symmetric P = (a b c / b d e / c e f), x = (1, x1, x2):
        #   Px = P x;  gain = Px / (lambda/weight + x.Px);  theta += gain * residual;
        #   P = (P - gain Px^T) / lambda
        a, b, c, d, e, f = self._P
        px0, px1, px2 = a + b * x1 + c * x2, b + d * x1 + e * x2, c + e * x1 + f * x2
        denom = self._lam / weight + px0 + x1 * px1 + x2 * px2
        g0, g1, g2 = px0 / denom, px1 / denom, px2 / denom
        theta[0] += g0 * residual
        theta[1] += g1 * residual
        theta[2] += g2 * residual
        inv = 1.0 / self._lam
        a, b, c = (a - g0 * px0) * inv, (b - g0 * px1) * inv, (c - g0 * px2) * inv
        d, e, f = (d - g1 * px1) * inv, (e - g1 * px2) * inv, (f - g2 * px2) * inv
        top = max(a, d, f)
        if top > self._p0:  # wind-up guard: never less sure than the prior
            k = self._p0 / top
            a, b, c, d, e, f = a * k, b * k, c * k, d * k, e * k, f * k
        self._P = (a, b, c, d, e, f)
        self.samples += 1

    def _relative_weight(self, fit: float, ms: float) -> float:
        """(typical / fit)^2: least squares on relative error, so a 50 ms request counts as
        much as a 50 s one (service noise is multiplicative, and SJF orders by ratio)."""
        ref = self._ref
        self._ref = ms if ref is None else ref + self._alpha * (min(ms, 3.0 * ref) - ref)
        ref = self._ref
        return min(1e4, max(1e-4, (ref / fit) ** 2))

    def observe_output(self, requested_tokens: int, generated_tokens: int) -> None:
        """Generated vs requested output of one request (from the response's usage)."""
        if requested_tokens > 0:
            ratio = min(1.0, max(0.0, generated_tokens / requested_tokens))
            self._fill += self._alpha * (ratio - self._fill)

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
        a, b, c = self._theta
        return a, b / _SCALE, c / _SCALE

    @property
    def output_fill_ratio(self) -> float:
        return self._fill

    def statistics(self) -> dict:
        a, b, c = self.coefficients
        return {
            "base_ms": a,
            "ms_per_prompt_token": b,
            "ms_per_output_token": c,
            "output_fill_ratio": self._fill,
            "samples": self.samples,
            "mean_abs_relative_error": self.error,
        }

    def __repr__(self) -> str:
        a, b, c = self.coefficients
        return f"<ServiceModel {a:.1f} + {b:.4f}*prompt + {c:.3f}*output ms, fill={self._fill:.2f}, n={self.samples}>"


class ServiceModels:
    """One `ServiceModel` per route (keyed by path_prefix), kept across reloads
    unless the route's priors or the model settings change."""

    __slots__ = ("_models", "_routes", "_settings")

    def __init__(self) -> None:
        self._models: dict[str, ServiceModel] = {}
        self._routes: dict[str, object] = {}
        self._settings: tuple[int, float] | None = None

    def configure(self, routes, memory_samples: int, prior_samples: float) -> None:
        settings = (memory_samples, prior_samples)
        models = {}
        for route in routes:
            key = route.path_prefix
            keep = (
                settings == self._settings
                and self._routes.get(key) == route
                and key in self._models
            )
            models[key] = self._models[key] if keep else ServiceModel.from_route(route, *settings)
        self._models, self._settings = models, settings
        self._routes = {r.path_prefix: r for r in routes}

    def expected_ms(
        self, route: str, prompt_tokens: int, requested_output_tokens: int, fallback: float
    ) -> float:
        model = self._models.get(route)
        return (
            fallback if model is None else model.expected_ms(prompt_tokens, requested_output_tokens)
        )

    def fill(self, route: str) -> float:
        """Learned generated / requested output ratio for `route` (1.0 if unknown)."""
        model = self._models.get(route)
        return 1.0 if model is None else model.output_fill_ratio

    def learn(
        self,
        route: str,
        prompt_tokens: int,
        requested_output_tokens: int,
        expected_ms: float,
        ms: float,
        observed_prompt: int | None = None,
        observed_output: int | None = None,
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
            output = round(requested_output_tokens * model.output_fill_ratio)
        model.observe(prompt, output, ms, expected_ms)

    def statistics(self) -> dict:
        return {route: m.statistics() for route, m in self._models.items()}

    def __repr__(self) -> str:
        return f"<ServiceModels {list(self._models)}>"
