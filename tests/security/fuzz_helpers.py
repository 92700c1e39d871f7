"""What the two fuzzers share: one real sidecar and sim pod per module, the verdict on each answer, the budget.

The fuzzers run in CI for a short, fixed time: `FUZZ_EXAMPLES` examples each
(default 200), derandomized so that a CI run is repeatable (`FUZZ_RANDOM=1` explores
new examples; a failure then prints the seed and the shrunk example). Each example
uses a fresh TCP connection to the sidecar; what every example must get is an
answer that is not a 500, or a closed connection, within ANSWER_S, never silence;
and once all examples ran, the sidecar's log must hold no traceback. In CI a
failing example is reported as generated (no shrinking, which would spend minutes
re-running timeouts); `FUZZ_RANDOM=1` also shrinks it to a minimal one.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
ANSWER_S = 5.0  # a complete request is answered (the pod at speed 20 answers in ms) or refused by then
CLOSE_S = 3.0  # after we stop sending (half-close), the sidecar closes or answers by then

EXPLORE = os.environ.get("FUZZ_RANDOM") == "1"
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not EXPLORE,
    # In CI no shrinking: a failure costs its own time, not minutes of shrinking through timeouts.
    phases=list(Phase) if EXPLORE else [Phase.explicit, Phase.reuse, Phase.generate],
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    print_blob=True,
)

# A fuzzer may answer 400, 404, 405, 408, 411, 413, 414, 417, 422, 429, 431, 501, 502, 503, 504, 505: each a
# documented refusal. 500 is "internal error": a bug, whether the sidecar said it or relayed its pod's.
BUG_STATUSES = frozenset({500})
