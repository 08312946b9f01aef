"""A served request's way, stamped hop by hop without editing xrt: with XRT_STAMPS naming a directory and this folder
first on PYTHONPATH, every Python process started (the server's, the engine's, the bench client's) wraps a few of
xrt's functions to record time.perf_counter() (one clock for every process of the machine) and writes its stamps there
as JSON when it ends. `python scripts/serve_probe/hops.py DIR` prints the median of each hop. Concurrency 1 only (a
request's HTTP-side stamps are matched by the one in flight). The wrappers cost a few microseconds a call: compare
hops within one probed run, and TTFT figures only between runs that are both probed or both not.

    XRT_STAMPS=/tmp/st PYTHONPATH=scripts/serve_probe:$PYTHONPATH python -m xrt bench bench.scenario=serve \\
        executor=cudagraph bench.max_concurrency=1 "bench.request_rate=[0]" bench.num_requests=32
    python scripts/serve_probe/hops.py /tmp/st
"""

import os

_DIR = os.environ.get("XRT_STAMPS")

if _DIR:
    import atexit
    import functools
    import json
    import sys
    import time

    _pc = time.perf_counter
    _events: list[tuple[str, float, int | None]] = []  # (name, perf_counter, the HTTP side's choice key or None)
    _current: dict[str, float | None] = {}  # the HTTP side's request in flight

    def _dump(tag: str) -> None:
        with open(os.path.join(_DIR, f"{tag}-{os.getpid()}.json"), "w") as f:
            json.dump(_events, f)

    def _bracket(cls: type, name: str) -> None:
        """Stamps `name>` on entry to cls.name and `name<` on return."""
        original = getattr(cls, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            _events.append((name + ">", _pc(), None))
            try:
                return original(*args, **kwargs)
            finally:
                _events.append((name + "<", _pc(), None))

        setattr(cls, name, wrapped)

    def _http_side() -> None:
        import xrt.serve.app as app
        import xrt.serve.client as client
        import xrt.serve.in_process as in_process
        from xrt.serve.arrival import ARRIVAL

        body = app._body

        async def stamped_body(request, model):
            _current["h_arrival"] = request.scope.get(ARRIVAL)
            _current["h_handler"] = _pc()
            parsed = await body(request, model)
            _current["h_body"] = _pc()
            return parsed

        app._body = stamped_body
        submit = client.EngineClient.submit

        def stamped_submit(self, requests, received=None, stream=False):
            prepared = _pc()
            job = submit(self, requests, received, stream)
            key = job.choices[0].key
            _events.extend([(n, _current.get(n), key) for n in ("h_arrival", "h_handler", "h_body")])
            _events.extend([("h_prepared", prepared, key), ("h_submitted", _pc(), key)])
            return job

        client.EngineClient.submit = stamped_submit
        handle = in_process.ProcessEngine._handle

        def stamped_handle(self, msg):
            now = _pc()
            if msg[0] == "step":
                for key, _tokens, _text, _output, scheduled, _logprobs in msg[1]:
                    _events.extend([("h_msg", now, key), ("e_scheduled_at", scheduled, key),
                                    ("e_step_end", msg[3], key)])
            return handle(self, msg)

        in_process.ProcessEngine._handle = stamped_handle
        sent = app.Sent.__call__

        def stamped_sent(self):
            sent(self)
            _events.append(("h_written", _pc(), self.job.choices[0].key))

        app.Sent.__call__ = stamped_sent
        atexit.register(_dump, "http")

    def _engine_side() -> None:
        import xrt.engine.engine as engine
        import xrt.engine.scheduler as scheduler
        import xrt.kvcache.manager as manager
        import xrt.serve.core as core
        import xrt.serve.in_process as in_process
        import xrt.serve.wire as wire

        feed = wire.Frames.feed

        def stamped_feed(self, data):
            got = _pc()
            ops = feed(self, data)
            for op in ops:
                if op and op[0] == "add":
                    _events.extend([("e_recv", got, op[1]), ("e_unpickled", _pc(), op[1])])
            return ops

        wire.Frames.feed = stamped_feed
        take = in_process.PipeInbox.take

        def stamped_take(self):
            ops = take(self)
            now = _pc()
            _events.extend(("e_taken", now, op[1]) for op in ops if op[0] == "add")
            return ops

        in_process.PipeInbox.take = stamped_take
        apply = core.Core._apply

        def stamped_apply(self, op):
            stop = apply(self, op)
            if op[0] == "add":
                _events.append(("e_queued", _pc(), op[1]))
            return stop

        core.Core._apply = stamped_apply
        run = core.Core.run

        def stamped_run(self, inbox):
            try:
                return run(self, inbox)
            finally:  # the engine process ends through os._exit: no atexit there
                _dump("engine")

        core.Core.run = stamped_run
        for name in ("step_stream", "_forward", "_step_sync", "_launch_overlapped", "_prefetch_waiting", "_resolve",
                     "_sample", "_append"):
            _bracket(engine.LLMEngine, name)
        for name in ("schedule", "schedule_overlapped", "postprocess"):
            _bracket(scheduler.Scheduler, name)
        for name in ("step_started", "step_launched", "step_read_back"):
            _bracket(manager.KVCacheManager, name)

    # The engine's process is multiprocessing's spawn child; every other process is treated as the HTTP side (the
    # bench client's wraps functions it never calls).
    if "--multiprocessing-fork" in getattr(sys, "orig_argv", sys.argv):
        _engine_side()
    else:
        _http_side()
