"""The `serve` section of the schema: `python -m xrt serve`, the OpenAI-compatible HTTP server (xrt/serve)."""

from __future__ import annotations

import attrs

from xrt.reflect import field, ge, in_range


@attrs.define
class ServeArgs:
    host: str = field(
        "127.0.0.1", help="address the server listens on; 127.0.0.1 keeps it to this machine (0.0.0.0: every "
        "interface, so anyone who can reach the host can use the model: set serve.api_key)",
    )
    port: int = field(8000, help="TCP port; 0: a free one the OS picks (logged at start-up)",
                      validator=in_range(0, 65535))
    served_model_name: str = field(
        "", help="the model name clients send and /v1/models lists; empty: model.name"
    )
    api_key: str = field(
        "", help="when set, every /v1 request needs `Authorization: Bearer <api_key>` (401 otherwise); /health and "
        "/metrics stay open",
    )
    max_queued: int = field(
        1024, help="most requests waiting beyond the scheduler.max_num_seqs that run at once (each of a request's "
        "`n` choices counts); one more gets 503", validator=ge(0),
    )
    grace_period_s: float = field(
        30.0, help="on SIGTERM the server stops accepting and lets requests in flight finish for this long, then "
        "cancels the rest and exits 0", unit="s", validator=ge(0),
    )
    engine_process: bool = field(
        True, help="run the engine in a process of its own, so the HTTP side (parsing, checking, shaping and sending "
        "hundreds of streams) never holds up a step and the engine never holds up a response; false: a thread of the "
        "HTTP process, sharing its GIL",
    )
    idle_spin_ms: float = field(
        10.0, help="with serve.engine_process, how long the engine's process keeps polling its pipe when it has gone "
        "idle before it sleeps: a request that comes within it (the next one of a client that sends one after "
        "another) is taken without a wake-up, which costs a cold process tenths of a millisecond of its TTFT; one "
        "core is busy for that long after each burst of work. 0: sleep at once", unit="ms", validator=ge(0),
    )
    freeze_gc: bool = field(
        True, help="once started, freeze what start-up made (modules, the model's Python objects, the config) out of "
        "the garbage collector's reach in the HTTP and the engine's process (gc.freeze), as vLLM and SGLang do: a full "
        "collection while serving then walks only what serving made, instead of holding up a step or every stream "
        "for as long as it takes to walk the whole heap (figures: bench/results/cpu-issue24-s26); the frozen "
        "objects are collected again once the server stops",
    )
    http_spin_ms: float = field(
        10.0, help="with serve.engine_process, the HTTP process's event loop polls instead of sleeping while requests "
        "are live and for this long after the last one ends, so a step's tokens (and the next request of a client "
        "that sends one after another) are handled without waking the process; one more core busy meanwhile. 0: "
        "sleep whenever idle (figures: bench/NOTES.md)", unit="ms", validator=ge(0),
    )
