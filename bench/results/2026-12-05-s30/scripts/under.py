import sys, re, collections
us = float(sys.argv[2]); target = sys.argv[3]
child = collections.Counter(); total = 0; tin = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" "); n = int(n); total += n
    frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
    idx = [i for i, f in enumerate(frames) if f.startswith(target + " ")]
    if not idx: continue
    i = idx[0]; tin += n
    nxt = frames[i + 1] if i + 1 < len(frames) else "<self>"
    nxt = re.sub(r"\(.*/(site-packages|python3.11|work/main)/", "(", nxt)
    child[nxt] += n
print("%s: %.1f us" % (target, us * tin / total))
for f, n in child.most_common(25):
    print("   %6.1fus  %s" % (us * n / total, f))
