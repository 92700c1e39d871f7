"""The simulated GPU inference pod (`rampmeter sim-pod`): see cli.py and engine.py.

Public API for tests and benchmarks:
- `PROFILES`, `Profile`, `get_profile(name, **overrides)`        (profiles.py)
- `oracle(kind, body, profile, seed) -> Oracle`                   (workload.py)
- `Engine` (pure), `Pod` (trio step loop), `PodAPI` (the handler)
"""

from proxy.simpod.engine import Engine, EngineStats, Sequence
from proxy.simpod.profiles import PROFILES, Profile, get_profile
from proxy.simpod.workload import (
    CHAT,
    COMPLETION,
    EMBEDDING,
    BadRequest,
    Job,
    Oracle,
    oracle,
    parse_job,
)

__all__ = [
    "CHAT",
    "COMPLETION",
    "EMBEDDING",
    "PROFILES",
    "BadRequest",
    "Engine",
    "EngineStats",
    "Job",
    "Oracle",
    "Profile",
    "Sequence",
    "get_profile",
    "oracle",
    "parse_job",
]
