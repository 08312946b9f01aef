"""Stamps along a request's way in (HTTP process and engine process); run as: python probe.py <xrt bench args>."""
import os, sys, time, json, atexit
pc = time.perf_counter
OUT = os.environ.get("PROBE_OUT", "/tmp/probe/stamps")
REC = []
VAL2 = []

import xrt.serve.front as front
import xrt.serve.app as app
import xrt.serve.in_process as ip
import xrt.serve.core as core
import xrt.engine.engine as eng
import xrt.bench.serve as bserve
_rc = bserve.run_child
bserve.run_child = lambda module, spec, what: _rc("ab.clientprobe" if module == "xrt.bench.serve_client" else module, spec, what)

_fc = front.Front.__call__
async def fcall(self, scope, receive, send):
    if scope["type"] == "http" and scope["method"] == "POST":
        REC.append(("arrival", scope.get("xrt.arrival")))
        REC.append(("front", pc()))
    return await _fc(self, scope, receive, send)
front.Front.__call__ = fcall

_body = app._body
async def body(request, model):
    REC.append(("body0", pc()))
    raw = await request.body()
    REC.append(("bodyread", pc()))
    r = model.model_validate_json(raw)
    REC.append(("validated", pc()))
    if os.environ.get("PROBE_TWICE"):
        t = pc(); model.model_validate_json(raw); t2 = pc(); model.model_validate_json(raw); t3 = pc()
        VAL2.append(((t2 - t) * 1e6, (t3 - t2) * 1e6))
    return r
app._body = body
_prep = app.prepare_completion
def prep(*a, **k):
    r = _prep(*a, **k); REC.append(("prepared", pc())); return r
app.prepare_completion = prep
_send = ip.ProcessEngine._send
def send(self, op):
    if op[0] == "add":
        REC.append(("send0", pc()))
    _send(self, op)
    if op[0] == "add":
        REC.append(("sent", pc()))
ip.ProcessEngine._send = send
_handle = ip.ProcessEngine._handle
def handle(self, msg):
    if msg[0] == "step":
        REC.append(("stepmsg", pc(), msg[3]))
    _handle(self, msg)
    if msg[0] == "step":
        REC.append(("handled", pc()))
ip.ProcessEngine._handle = handle
import xrt.serve.responses as resp
import xrt.serve.sse as sse
_chunk = resp.Shapes.chunk
def chunk(self, *a, **k):
    REC.append(("chunk0", pc())); return _chunk(self, *a, **k)
resp.Shapes.chunk = chunk
_es = sse.EventStream.__call__
async def escall(self, scope, receive, send):
    async def s2(msg):
        if msg.get("more_body"):
            REC.append(("send0", pc()))
        return await send(msg)
    return await _es(self, scope, receive, s2)
sse.EventStream.__call__ = escall

_sent = app.Sent.__call__
def sentcall(self):
    if self.pending and any(not last for _, _, last in self.pending):
        REC.append(("written", pc()))
    _sent(self)
app.Sent.__call__ = sentcall

# engine process
_read = ip.PipeInbox._read
def read(self):
    got = _read(self)
    if got:
        REC.append(("e_read", pc()))
    return got
ip.PipeInbox._read = read
_apply = core.Core._apply
def apply(self, op):
    t = pc()
    r = _apply(self, op)
    if op[0] == "add":
        REC.append(("e_apply0", t)); REC.append(("e_applied", pc()))
    return r
core.Core._apply = apply
_ss = eng.LLMEngine.step_stream
def ss(self):
    t = pc()
    out = _ss(self)
    for d in out:
        if d.output is None and d.scheduled_at is not None and len(d.token_ids) and d.scheduled_at > t - 0.0:
            pass
    REC.append(("e_step", t, pc(), [d.scheduled_at for d in out][:1]))
    return out
eng.LLMEngine.step_stream = ss
_run = core.Core.run
def run(self, inbox):
    try:
        return _run(self, inbox)
    finally:
        with open(OUT + ".engine.json", "w") as f:
            json.dump(REC, f)
core.Core.run = run

def dump():
    with open(OUT + ".http.json", "w") as f:
        json.dump(REC, f)
    if VAL2:
        import statistics as st
        print("validate again, twice: medians us", st.median(v[0] for v in VAL2), st.median(v[1] for v in VAL2))
if __name__ == "__main__":
    atexit.register(dump)
    from xrt.cli.main import main
    sys.argv = ["xrt"] + sys.argv[1:]
    sys.exit(main())
