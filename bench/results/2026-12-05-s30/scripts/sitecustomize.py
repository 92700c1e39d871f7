import cProfile, os, signal, time
_p = None
def _start(*a):
    global _p
    _p = cProfile.Profile(); _p.enable()
def _stop(*a):
    global _p
    if _p is not None:
        _p.disable(); _p.dump_stats("%s.%d.%d" % (os.environ["PROF_OUT"], os.getpid(), int(time.time()*1000))); _p = None
if os.environ.get("PROF_OUT"):
    signal.signal(signal.SIGUSR1, _start); signal.signal(signal.SIGUSR2, _stop)
