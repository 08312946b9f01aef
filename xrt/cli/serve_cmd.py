"""`python -m xrt serve`: the OpenAI-compatible HTTP server (xrt/serve) over the configured model, on
`serve.host:serve.port` (127.0.0.1:8000 by default). Exit 0 after SIGTERM (requests in flight finish within
`serve.grace_period_s`); 2 for a problem before serving (the serve extra missing, the port taken, the model)."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack

from xrt.config import LogLevel, XrtConfig


def main(cfg: XrtConfig) -> int:
    try:
        from xrt.serve.app import build_state
        from xrt.serve.server import listen, run
    except ImportError as e:
        print(f"error: xrt serve needs the serve extra (pip install 'xrt[serve]'): {e}", file=sys.stderr)
        return 2
    with ExitStack() as closing:
        try:
            sock = listen(cfg.serve.host, cfg.serve.port)  # before the model loads: a port in use fails at once
            closing.callback(sock.close)
            state = build_state(cfg)
            closing.callback(state.close)
        except (ValueError, OSError) as e:
            if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
                raise
            print(f"error: {e}", file=sys.stderr)
            return 2
        return run(state, sock, debug=cfg.log_level is LogLevel.DEBUG)
