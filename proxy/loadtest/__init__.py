"""`rampmeter loadtest`: open/closed-loop load, sweeps, goodput, the knee, reports and plots.

Programmatic API (benchmarks and `make demo` use it; the CLI is a thin layer on it):

    from proxy import loadtest as lt
    mix = lt.Mix.parse("short_chat=3,long_chat=1")
    plan = lt.Plan.sweep([100, 200, 300], step_s=10, warmup_s=2)          # open loop, Poisson
    trace = lt.build_trace(plan, mix, seed=1)                              # reusable across targets
    result = lt.run_sync(trace, lt.Target("http://127.0.0.1:8000", protocol="h2c"))
    analysis = result.analyze(lt.SLA.parse("p99=500ms"))
    print(analysis.knee.summary)
    doc = lt.document(result, analysis)                                    # the JSON schema
    lt.write_outputs(doc, "loadtest-out")                                  # JSON, Markdown, PNGs

Inside trio: `await lt.run(trace, target)`, `await lt.run_interleaved(trace, [a, b])`.
"""

from proxy.loadtest.analysis import Analysis, StepAnalysis, analyze
from proxy.loadtest.jsonl import JsonlError
from proxy.loadtest.jsonl import load as load_jsonl
from proxy.loadtest.outputs import write_outputs
from proxy.loadtest.records import ERROR_NAMES, Records, StepRun
from proxy.loadtest.report import document
from proxy.loadtest.result import RunResult
from proxy.loadtest.runner import Runner, run, run_interleaved, run_sync
from proxy.loadtest.shapes import BUILTIN_NAMES, Mix, Shape, builtin
from proxy.loadtest.stats import Figures, Summary, percentile, summarize
from proxy.loadtest.target import Target
from proxy.loadtest.trace import Plan, Step, Trace, build_trace, parse_loads
from proxy.loadtest.verdict import SLA, Knee, find_knee

__all__ = [
    "BUILTIN_NAMES",
    "ERROR_NAMES",
    "SLA",
    "Analysis",
    "Figures",
    "JsonlError",
    "Knee",
    "Mix",
    "Plan",
    "Records",
    "RunResult",
    "Runner",
    "Shape",
    "Step",
    "StepAnalysis",
    "StepRun",
    "Summary",
    "Target",
    "Trace",
    "analyze",
    "build_trace",
    "builtin",
    "document",
    "find_knee",
    "load_jsonl",
    "parse_loads",
    "percentile",
    "run",
    "run_interleaved",
    "run_sync",
    "summarize",
    "write_outputs",
]
