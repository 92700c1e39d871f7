"""`rampmeter calibrate URL`: measure a running model server and write the policy it needs.

Programmatic API (the benchmark and tests use it; the CLI is a thin layer on it):

    from proxy.calibrate import Options, calibrate, policy_toml
    cal = trio.run(calibrate, Options("http://127.0.0.1:8000"))
    text = policy_toml(cal)              # a commented policy; check_policy(text) loads it

Modules: `shapes.py` (what is sent), `measure.py` (the trio driver, reusing
proxy.loadtest for the closed-loop steps), `fit.py` (pure conclusions),
`render.py` (the policy text), `cli.py`.
"""

from proxy.calibrate.measure import Calibration, CalibrationError, Options, calibrate
from proxy.calibrate.render import check_policy, policy_toml

__all__ = ["Calibration", "CalibrationError", "Options", "calibrate", "check_policy", "policy_toml"]
