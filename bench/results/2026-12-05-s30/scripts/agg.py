import sys, re, collections
us_per_req = float(sys.argv[2])
inc, slf = collections.Counter(), collections.Counter(); total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" "); n = int(n); total += n
    frames = [re.sub(r":\d+\)$", ")", f).replace("/work/main/", "").replace("/root/.pyenv/versions/3.11.7/lib/python3.11/", "") for f in stack.split(";")]
    frames = [re.sub(r"\(.*site-packages/", "(", f) for f in frames]
    for f in set(frames): inc[f] += n
    slf[frames[-1]] += n
mode = sys.argv[3] if len(sys.argv) > 3 else "inc"
c = inc if mode == "inc" else slf
flt = sys.argv[4] if len(sys.argv) > 4 else ""
for f, n in c.most_common(400):
    if flt in f and n / total > 0.004:
        print("%6.1f%% %6.1fus  %s" % (100 * n / total, us_per_req * n / total, f))
