import os
D = os.environ.get("XRT_GCSTAMPS")
if D:
    import gc, time, atexit, json, sys
    ev = []
    st = {}
    def cb(phase, info):
        if phase == "start":
            st["t"] = time.perf_counter()
        else:
            ev.append((info["generation"], time.perf_counter() - st["t"], time.perf_counter()))
    gc.callbacks.append(cb)
    def dump():
        with open(os.path.join(D, f"gc-{os.getpid()}-{'eng' if '--multiprocessing-fork' in sys.orig_argv else 'main'}.json"), "w") as f:
            json.dump({"ev": ev, "objects": len(gc.get_objects())}, f)
    atexit.register(dump)
    if "--multiprocessing-fork" in sys.orig_argv:
        import xrt.serve.core as core
        o = core.Core.run
        def run(self, inbox):
            try:
                t = time.perf_counter(); gc.collect(); ev.append(("full", time.perf_counter() - t, gc.get_freeze_count()))
                ev.append(("start", len(gc.get_objects()), 0))
                return o(self, inbox)
            finally:
                dump()
        core.Core.run = run
    else:
        try:
            import xrt.serve.server as server
            o2 = server.BackgroundServer.start
            def start(self, *a, **k):
                r = o2(self, *a, **k)
                t = time.perf_counter(); gc.collect(); ev.append(("full", time.perf_counter() - t, gc.get_freeze_count()))
                ev.append(("start", len(gc.get_objects()), 0))
                return r
            server.BackgroundServer.start = start
            o3 = server.BackgroundServer.stop
            def stop(self, *a, **k):
                ev.append(("stop", time.perf_counter(), 0))
                return o3(self, *a, **k)
            server.BackgroundServer.stop = stop
        except Exception:
            pass
