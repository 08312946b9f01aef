# Temporary timing stamps along the serve request path (the probe; never committed).
edits = {
 "xrt/serve/app.py": [("    received = request.scope.get(ARRIVAL) or time.perf_counter()\n", "    received = request.scope.get(ARRIVAL) or time.perf_counter()\n    import stamps; stamps.mark('B_arrival_' + repr(received)); stamps.mark('C_handler')\n"),
   ("    prepared = prepare(body, state.admission, state.samplings)\n", "    stamps.mark('D_body')\n    prepared = prepare(body, state.admission, state.samplings)\n    stamps.mark('E_prepared')\n"),
   ("    job = state.loop.submit(prepared.requests, received, stream=prepared.stream)\n", "    job = state.loop.submit(prepared.requests, received, stream=prepared.stream)\n    stamps.mark('F_submitted')\n"),
   ("        if texts:\n            yield", "        if texts:\n            import stamps; stamps.mark('M_yield')\n            yield")],
 "xrt/serve/in_process.py": [("            self._ops.extend(self.frames.feed(data))\n", "            self._ops.extend(self.frames.feed(data))\n            import stamps; stamps.mark('G_recv')\n"),
   ("def _send_step(sock: socket.socket, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:\n", "def _send_step(sock: socket.socket, items: list[tuple[int, StreamOutput]], state: EngineState, at: float) -> None:\n    import stamps; stamps.mark('K2_send')\n"),
   ("    def data_received(self, data: bytes) -> None:\n", "    def data_received(self, data: bytes) -> None:\n        import stamps; stamps.mark('K3_pipe_data')\n")],
 "xrt/serve/core.py": [("            for op in inbox.take():\n", "            ops = inbox.take()\n            if ops:\n                import stamps; stamps.mark('H_taken')\n            for op in ops:\n"),
   ("                deltas = engine.step_stream()\n", "                deltas = engine.step_stream()\n                import stamps; stamps.mark('K_stepdone')\n")],
 "xrt/engine/engine.py": [("            now = time.perf_counter()\n            for seq in scheduled.seqs:\n", "            now = time.perf_counter()\n            import stamps; stamps.mark('J_scheduled')\n            for seq in scheduled.seqs:\n")],
 "xrt/serve/client.py": [("        now = time.perf_counter()\n        self.metrics.engine_state(state)\n", "        now = time.perf_counter()\n        import stamps; stamps.mark('L_dispatch')\n        self.metrics.engine_state(state)\n")],
 "xrt/serve/sse.py": [("                if self._on_sent is not None:\n", "                import stamps; stamps.mark('N_sent')\n                if self._on_sent is not None:\n")],
 "xrt/bench/serve_client.py": [("    start = time.perf_counter()\n    ttft: float | None = None\n", "    start = time.perf_counter()\n    import stamps; stamps.mark('A_client_start')\n    ttft: float | None = None\n"),
   ("                        if ttft is None:\n                            ttft = now - start\n", "                        if ttft is None:\n                            ttft = now - start\n                            stamps.mark('Z_client_first')\n")],
}
import sys
root = sys.argv[1]
for f, subs in edits.items():
    s = open(f"{root}/{f}").read()
    for a, b in subs:
        assert s.count(a) == 1, (f, a)
        s = s.replace(a, b)
    open(f"{root}/{f}", "w").write(s)
