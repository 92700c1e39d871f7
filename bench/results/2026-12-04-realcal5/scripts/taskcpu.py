"""`python taskcpu.py OUT.json serve ...`: the sidecar with a trio Instrument that charges thread CPU to each task.

Between steps of tasks the run loop itself works (epoll, deadlines, rescheduling): charged to "<loop>".
Written to OUT.json on SIGUSR1 (counts since the previous dump) and at exit.
"""
import collections, json, signal, sys, time
import trio
import os; sys.path.insert(0, os.getcwd())

out = sys.argv.pop(1)
cpu = collections.Counter(); steps = collections.Counter()

def name_of(task):
    n = task.name
    return n.split(".<locals>")[0] if "<locals>" in n else n

class Charge(trio.abc.Instrument):
    def __init__(self):
        self.t = time.thread_time()
    def before_task_step(self, task):
        now = time.thread_time(); cpu["<loop>"] += now - self.t; self.t = now
    def after_task_step(self, task):
        now = time.thread_time(); k = name_of(task); cpu[k] += now - self.t; steps[k] += 1; self.t = now

def dump(*_):
    doc = {"at": time.time(), "cpu_ms": {k: round(v * 1000, 2) for k, v in cpu.most_common()}, "steps": dict(steps)}
    with open(out, "a") as f:
        f.write(json.dumps(doc) + "\n")
    cpu.clear(); steps.clear()

signal.signal(signal.SIGUSR1, dump)
_run = trio.run
def run(*a, **kw):
    kw.setdefault("instruments", []).append(Charge())
    return _run(*a, **kw)
trio.run = run
from proxy.cli import main
try:
    code = main(sys.argv[1:])
finally:
    dump()
sys.exit(code)
