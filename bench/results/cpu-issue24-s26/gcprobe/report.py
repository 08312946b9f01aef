import json, glob, collections, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    ev = d["ev"]
    start = [i for i, e in enumerate(ev) if e[0] == "start"]
    if not start: continue
    full = [e for e in ev if e[0] == "full"]
    print("a full collection once started: %.1f ms (%d frozen);" % (full[-1][1]*1e3, full[-1][2]) if full else "", "objects tracked at start", ev[start[-1]][1], end="; ")
    ev = ev[start[-1]+1:]
    stop = [i for i, e in enumerate(ev) if e[0] == "stop"]
    if stop: ev = ev[:stop[0]]
    by = collections.defaultdict(list)
    for g, t, c in ev:
        if g != "full": by[g].append(t*1e3)
    print(f.split("/")[-1], {g: f"{len(v)} collections, {sum(v):.1f} ms in all, max {max(v):.2f}" for g, v in sorted(by.items())})
