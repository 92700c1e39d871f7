import os, sys
if os.environ.get("GC_OUT") and "serve" in sys.argv:
    import gc, time, atexit
    _t = [0.0, 0.0, None]; rec = []
    def cb(phase, info):
        if phase == "start":
            g = info["generation"]
            objs = gc.get_objects(g) if g < 2 else []
            n = len(objs); top = ""
            if n > 20000:
                from collections import Counter
                top = str(Counter(type(o).__name__ for o in objs).most_common(8))
            del objs
            _t[0] = time.perf_counter(); _t[1] = time.thread_time(); _t[2] = (gc.get_count(), n, top)
        else:
            d = time.perf_counter() - _t[0]; c = time.thread_time() - _t[1]
            if d > 0.01: rec.append((time.time(), info["generation"], d, c, info["collected"], info["uncollectable"], str(_t[2])))
    gc.callbacks.append(cb)
    def dump():
        with open(os.environ["GC_OUT"] + f".{os.getpid()}", "w") as f:
            for r in rec: f.write("%.3f gen%d wall %.4f cpu %.4f collected %d uncoll %d counts %s\n" % r)
    atexit.register(dump)
