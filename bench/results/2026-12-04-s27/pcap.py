"""Per-connection payload timelines from a pcap on lo; gaps between a response's last byte and the next request."""
import json, struct, sys, statistics
from collections import defaultdict

def packets(path):
    with open(path, "rb") as f:
        gh = f.read(24)
        magic, = struct.unpack("<I", gh[:4])
        endian = "<" if magic in (0xa1b2c3d4, 0xa1b23c4d) else ">"
        nano = magic in (0xa1b23c4d, 0x4d3cb2a1)
        link = struct.unpack(endian + "I", gh[20:24])[0]
        while True:
            h = f.read(16)
            if len(h) < 16: return
            ts, frac, incl, orig = struct.unpack(endian + "IIII", h)
            data = f.read(incl)
            t = ts + frac / (1e9 if nano else 1e6)
            off = 14 if link == 1 else (16 if link == 113 else 0)
            ip = data[off:]
            if ip[0] >> 4 != 4: continue
            ihl = (ip[0] & 15) * 4; total = struct.unpack(">H", ip[2:4])[0]
            tcp = ip[ihl:]
            sport, dport = struct.unpack(">HH", tcp[:4]); doff = (tcp[12] >> 4) * 4; flags = tcp[13]
            yield t, sport, dport, total - ihl - doff, flags

def analyse(path, server_port):
    conns = defaultdict(list)  # client port -> [(t, dir, n)]
    for t, sp, dp, n, fl in packets(path):
        if n <= 0: continue
        if dp == server_port: conns[sp].append((t, "c", n))
        elif sp == server_port: conns[dp].append((t, "s", n))
    gaps, waits = [], []  # client think gap: last server byte -> next client byte; server wait: last client byte -> first server byte
    for port, ev in conns.items():
        last_s = last_c = None; prev = None
        for t, d, n in ev:
            if d == "c" and prev == "s" and last_s is not None: gaps.append((t - last_s, port, t))
            if d == "s" and prev == "c" and last_c is not None: waits.append((t - last_c, port, t))
            if d == "s": last_s = t
            else: last_c = t
            prev = d
    return conns, gaps, waits

def q(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None

if __name__ == "__main__":
    ports = json.load(open(sys.argv[2]))
    for role in ("data", "vllm", "admin"):
        conns, gaps, waits = analyse(sys.argv[1], int(ports[role]))
        g = [x[0] * 1000 for x in gaps]; w = [x[0] * 1000 for x in waits]
        if not conns: continue
        print(f"{role}: conns {len(conns)} client-gap ms n={len(g)} p50 {q(g,.5) and round(q(g,.5),1)} p90 {q(g,.9) and round(q(g,.9),1)} max {g and round(max(g),1)}"
              f" | server-wait ms n={len(w)} p50 {q(w,.5) and round(q(w,.5),1)} p90 {q(w,.9) and round(q(w,.9),1)} max {w and round(max(w),1)}")
