import json, statistics as st, sys
base = sys.argv[1] if len(sys.argv) > 1 else "/tmp/probe/stamps"
h = json.load(open(base + ".http.json")); e = json.load(open(base + ".engine.json"))
# requests: group http stamps starting at "arrival"
reqs = []
cur = None
for r in h:
    if r[0] == "arrival":
        cur = {"arrival": r[1]}; reqs.append(cur)
    elif cur is not None and r[0] in ("front","body0","bodyread","validated","prepared","send0","sent") and r[0] not in cur:
        cur[r[0]] = r[1]
# engine: for each request, first e_read after 'send0', then e_apply0, e_applied, first e_step start after applied, scheduled_at
ereads = [r[1] for r in e if r[0]=="e_read"]
ap0 = [r[1] for r in e if r[0]=="e_apply0"]; ap1 = [r[1] for r in e if r[0]=="e_applied"]
steps = [(r[1], r[2], r[3]) for r in e if r[0]=="e_step"]
import bisect
for q in reqs:
    if "sent" not in q: continue
    i = bisect.bisect_left(ereads, q["send0"]); q["e_read"] = ereads[i] if i < len(ereads) else None
    i = bisect.bisect_left(ap0, q["send0"]); q["e_apply0"] = ap0[i]; q["e_applied"] = ap1[i]
    for s in steps:
        if s[0] >= q["e_applied"]:
            q["e_step0"] = s[0]; q["sched"] = s[2][0] if s[2] else None; q["e_step1"] = s[1]; break
keys = ["arrival","front","body0","bodyread","validated","prepared","send0","sent","e_read","e_apply0","e_applied","e_step0","sched"]
reqs = [q for q in reqs if all(q.get(k) is not None for k in keys)][4:]
print(len(reqs), "requests")
for a, b in zip(keys, keys[1:]):
    d = [(q[b]-q[a])*1e6 for q in reqs]
    print(f"{a:>10} -> {b:<10} median {st.median(d):8.1f} us  mean {st.mean(d):8.1f}")
d = [(q["sched"]-q["arrival"])*1e6 for q in reqs]
print(f"arrival -> sched median {st.median(d):.1f} mean {st.mean(d):.1f}")
# way back: first token of each request: step end `at` (stepmsg[2]) -> stepmsg received -> first "written" after it
msgs = [(r[1], r[2]) for r in h if r[0] == "stepmsg"]
writ = [r[1] for r in h if r[0] == "written"]
back1, back2 = [], []
for q in reqs:
    s1 = q["e_step1"]
    m = next((m for m in msgs if m[1] >= s1), None)
    if m is None: continue
    w = writ[bisect.bisect_left(writ, m[0])] if bisect.bisect_left(writ, m[0]) < len(writ) else None
    back1.append((m[0]-m[1])*1e6); 
    if w: back2.append((w-m[0])*1e6)
if back1:
    print(f"first token: step end -> msg at http median {st.median(back1):.1f} us; msg -> chunk written median {st.median(back2):.1f} us")
pre = [(q["e_step1"]-q["sched"])*1e6 for q in reqs]
print(f"sched -> first step end (prefill) median {st.median(pre):.1f} us")
import os
if os.path.exists(base + ".client.json"):
    c = json.load(open(base + ".client.json"))
    arr = sorted(r[1] for r in h if r[0] == "arrival")
    wr = sorted(r[1] for r in h if r[0] == "written")
    out, hdr, back, parse = [], [], [], []
    for r in c[4:]:
        if "c_ttft" not in r: continue
        i = bisect.bisect_left(arr, r["c_start"])
        if i < len(arr): out.append((arr[i] - r["c_start"]) * 1e6)
        j = bisect.bisect_right(wr, r["c_line"]) - 1
        if j >= 0 and wr[j] >= r["c_start"]: back.append((r["c_line"] - wr[j]) * 1e6)
        parse.append((r["c_ttft"] - r["c_line"]) * 1e6)
    print(f"client start -> server arrival median {st.median(out):.1f} us; chunk written -> client has line median {st.median(back):.1f} us; line -> ttft stamp {st.median(parse):.1f} us (n={len(out)})")
# way back, finer: per stepmsg (first token of a request): handled, chunk0, send0(body), written
ev = [(r[0], r[1]) for r in h if r[0] in ("stepmsg", "handled", "chunk0", "send0", "written")]
seqs = {"handled": [], "chunk0": [], "send0": [], "written": []}
for q in reqs:
    s1 = q["e_step1"]
    idx = next((i for i, x in enumerate(ev) if x[0] == "stepmsg" and [m for m in msgs if m[0] == x[1]][0][1] >= s1), None)
    if idx is None: continue
    t = ev[idx][1]; prev = t
    for name in ("handled", "chunk0", "send0", "written"):
        nxt = next((x[1] for x in ev[idx+1:] if x[0] == name), None)
        if nxt is None: break
        seqs[name].append((nxt - prev) * 1e6); prev = nxt
print("way back steps (median us):", {k: round(st.median(v), 1) for k, v in seqs.items() if v})
