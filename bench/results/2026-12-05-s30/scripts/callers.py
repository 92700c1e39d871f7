import pstats, sys
st = pstats.Stats(sys.argv[1]); n = float(sys.argv[2])
for key, v in st.stats.items():
    name = key[2]
    if any(s == name for s in sys.argv[3:]):
        print("==", name, "%.2f/req" % (v[1]/n))
        for ck, cv in sorted(v[4].items(), key=lambda kv: -kv[1][0]):
            if cv[0]/n >= 0.5:
                print("   %6.2f  %s:%d:%s" % (cv[0]/n, ck[0].split('/work/main/')[-1].split('site-packages/')[-1], ck[1], ck[2]))
