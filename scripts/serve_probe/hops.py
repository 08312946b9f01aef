"""The median of each hop of a served request's way to its first token, from scripts/serve_probe's stamps:
`python scripts/serve_probe/hops.py DIR [SKIP]` (SKIP: the first requests left out, warm-up; default 3)."""

import glob
import json
import statistics
import sys

WAY_IN = ["h_arrival", "h_handler", "h_body", "h_prepared", "h_submitted", "e_recv", "e_unpickled", "e_taken",
          "e_queued"]


def load(directory: str) -> tuple[list, list]:
    http, engine = [], []
    for path in glob.glob(f"{directory}/http-*.json"):
        http += json.load(open(path))
    for path in glob.glob(f"{directory}/engine-*.json"):
        engine += json.load(open(path))
    engine.sort(key=lambda e: e[1])
    return http, engine


def main() -> None:
    directory = sys.argv[1]
    skip = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    http, engine = load(directory)
    by_key: dict[int, dict[str, list[float]]] = {}
    for name, t, key in http + engine:
        if key is not None and t is not None:
            by_key.setdefault(key, {}).setdefault(name, []).append(t)
    hops: dict[str, list[float]] = {}
    at: dict[str, list[float]] = {}  # where each hop starts, from the arrival: the order they print in
    keys = sorted(by_key)[skip:]
    used = 0
    for key in keys:
        s = by_key[key]
        if not {"h_arrival", "e_queued", "e_step_end", "h_msg"} <= s.keys():
            continue
        used += 1
        end = min(s["e_step_end"])  # the step that made the first token
        msg = s["h_msg"][s["e_step_end"].index(end)]
        stamps = [(n, s[n][0]) for n in WAY_IN if n in s]
        seen = set()
        for name, t, k in engine:  # the engine's first stamp of each kind on the way to that step's end
            if k is None and s["e_queued"][0] <= t <= end and name not in seen:
                seen.add(name)
                stamps.append((name, t))
        stamps += [("e_scheduled_at", s["e_scheduled_at"][0]), ("e_step_end", end), ("h_msg", msg)]
        stamps += [("h_written", t) for t in s.get("h_written", []) if t >= msg][:1]
        stamps.sort(key=lambda x: x[1])
        first = stamps[0][1]
        for (a, ta), (b, tb) in zip(stamps, stamps[1:], strict=False):
            hops.setdefault(f"{a} -> {b}", []).append((tb - ta) * 1e3)
            at.setdefault(f"{a} -> {b}", []).append(ta - first)
        hops.setdefault("total: arrival -> written", []).append((stamps[-1][1] - first) * 1e3)
    print(f"{used} requests (the first {skip} left out); hop: median ms (requests with it)")
    for name, values in sorted(hops.items(), key=lambda kv: statistics.median(at.get(kv[0], [float("inf")]))):
        print(f"{name:48s} {statistics.median(values):8.3f} ({len(values)})")


if __name__ == "__main__":
    main()
