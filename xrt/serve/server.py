"""uvicorn around the application. `run` serves in the foreground until SIGTERM or Ctrl-C: on SIGTERM the server
stops accepting, /health and new requests answer 503, requests in flight get `serve.grace_period_s` to finish
(uvicorn's graceful shutdown waits for their connections); then the engine aborts the rest, so each such
client still gets a well-formed end (finish_reason "abort", `[DONE]`), the engine stops, and `run` returns 0.
`BackgroundServer` runs the same on a thread (tests, a benchmark that starts its own server)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from xrt.log import get_logger
from xrt.serve.app import ServerState, build_app
from xrt.serve.arrival import http_protocol

log = get_logger(__name__)


def listen(host: str, port: int) -> socket.socket:
    """The bound socket (before the model loads, so a port in use fails in a second); port 0 picks a free one."""
    if not host.strip():
        # An empty host binds every interface: that must be asked for by name.
        raise OSError("serve.host: must not be empty (0.0.0.0 listens on every interface)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"serve.host / serve.port: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.grace_timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.state.draining:
            grace = self.state.args.grace_period_s
            log.info(f"signal {signal.Signals(sig).name}: draining, at most {grace:g} s")
            self.grace_timer = threading.Timer(grace, self.state.loop.abort_all)
            self.grace_timer.daemon = True
            self.grace_timer.start()
        self.state.draining = True
        super().handle_exit(sig, frame)


# uvicorn's own deadline, past the grace period's: by then the aborted requests have ended their responses; it
# only cancels a handler that failed to.
_BACKSTOP_S = 5.0


def _config(state: ServerState, debug: bool) -> uvicorn.Config:
    # xrt logs its own lines; uvicorn's per-request access lines only at log_level=debug.
    return uvicorn.Config(build_app(state), http=http_protocol(), lifespan="on",
                          log_level="info" if debug else "warning", access_log=debug,
                          timeout_graceful_shutdown=state.args.grace_period_s + _BACKSTOP_S)


def _ignore(sig: int, frame: FrameType | None) -> None:
    pass


def run(state: ServerState, sock: socket.socket, debug: bool = False) -> int:
    """Serves on sock until a signal; 0 after a SIGTERM drain (Ctrl-C: KeyboardInterrupt, as everywhere)."""
    server = _Server(_config(state, debug), state)
    # uvicorn re-raises the signal it shut down on, to the handler it found: this one lets SIGTERM end in exit 0.
    previous = signal.signal(signal.SIGTERM, _ignore)
    # Listening before the line that says so: a client that connects on it waits in the backlog while uvicorn's
    # start-up (the lifespan: the engine's pipe, the heap frozen) finishes, instead of being refused.
    sock.listen(server.config.backlog)
    log.info(f"serving {state.model_name} on {url_of(sock)} (OpenAI API under /v1, /metrics, /health)")
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server.grace_timer is not None:
            server.grace_timer.cancel()  # everything ended before the grace period did
    if state.loop.error is not None:
        return 1
    return 0


class BackgroundServer:
    """The server on a daemon thread (no signal handling there): `url`, `stop()`."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        self.sock = listen(host, port)
        self.url = url_of(self.sock)
        self.server = _Server(_config(state, False), state)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="xrt-serve", daemon=True)

    def start(self, timeout_s: float = 30.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops serving, then the engine (the state is this server's)."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.sock.close()
        self.state.close()
