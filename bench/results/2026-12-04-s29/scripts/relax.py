import random, statistics as st
lam=0.9/0.259
bins=[0]*30; cnt=[0]*30
for seed in range(400):
    r=random.Random(seed); t=0; free=0
    while t<300:
        t+=r.expovariate(lam); s=0.066 if r.random()<0.8 else 1.03
        start=max(t,free); free=start+s
        if t<300: b=int(t//10); bins[b]+=start-t; cnt[b]+=1
print([round(bins[i]/cnt[i],2) for i in range(30)])
