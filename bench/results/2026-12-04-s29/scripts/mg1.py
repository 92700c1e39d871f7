import random, heapq, statistics as st
def run(seed, T, warm, sjf):
    r=random.Random(seed); lam=0.9/0.259; t=0; arr=[]
    while t<T:
        t+=r.expovariate(lam); s=0.066 if r.random()<0.8 else 1.03; arr.append((t,s))
    # non-preemptive serial
    i=0; now=0; q=[]; out=[]
    while i<len(arr) or q:
        if not q and i<len(arr) and arr[i][0]>now: now=arr[i][0]
        while i<len(arr) and arr[i][0]<=now:
            a,s=arr[i]; heapq.heappush(q,((s if sjf else 0),a,s)); i+=1
        _,a,s=heapq.heappop(q); now+=s; out.append((a,s,now-a))
    sh=[l for a,s,l in out if s<0.5 and warm<=a<T]; lo=[l for a,s,l in out if s>0.5 and warm<=a<T]
    return st.median(sh), sorted(lo)[int(0.99*len(lo))]
for T,warm in [(90,5),(300,5),(300,100),(240,60),(400,100)]:
    rs=[]
    for seed in range(11,21):
        f=run(seed,T,warm,False); s=run(seed,T,warm,True); rs.append(f[0]/s[0])
    print(T,warm,"ratio median %.2f min %.2f"%(st.median(rs),min(rs)), [round(x,1) for x in rs])
print("abs")
for seed in (11,12,13):
    f=run(seed,90,5,False); s=run(seed,90,5,True); print(seed, "fcfs short p50 %.3f long p99 %.2f | sjf short p50 %.3f long p99 %.2f"%(f[0],f[1],s[0],s[1]))
