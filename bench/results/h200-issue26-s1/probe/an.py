import sys, glob, collections, statistics
ev = []
for f in glob.glob(sys.argv[1] + "/stamps.*"):
    for line in open(f):
        tag, t = line.split()
        if tag.startswith("B_arrival_"):
            ev.append(("B0_arrival", float(tag[len("B_arrival_"):]))); continue
        ev.append((tag, float(t)))
ev.sort(key=lambda e: e[1])
reqs = []; cur = None
for tag, t in ev:
    if tag == "A_client_start":
        cur = [(tag, t)]; reqs.append(cur)
    elif cur is not None:
        cur.append((tag, t))
reqs = reqs[-32:]
d = collections.defaultdict(list)
for r in reqs:
    seen = {}
    for tag, t in r:
        if tag not in seen: seen[tag] = t
    order = sorted(seen.items(), key=lambda x: x[1])
    for (a, ta), (b, tb) in zip(order, order[1:]):
        d[(a, b)].append((tb - ta) * 1e3)
    if "Z_client_first" in seen: d[("total", "")].append((seen["Z_client_first"] - seen["A_client_start"]) * 1e3)
for k, v in d.items():
    print(f"{k[0]:>18} -> {k[1]:<18} n={len(v):3d} median {statistics.median(v):8.3f} ms  mean {statistics.mean(v):8.3f}")
