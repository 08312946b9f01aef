"""The frames on the pipe between the HTTP process and the engine's: an 8-byte length, then a pickle. The HTTP side
writes them through an asyncio transport (a write never blocks: a burst of requests is buffered, not waited on,
whatever the socket holds) and parses what it reads with `Frames`; the engine side reads and writes its blocking
socket with `send` / `recv`."""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!Q")


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class Frames:
    """Frames out of a byte stream read in pieces."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buf = self._buf
        buf += data
        out = []
        start = 0
        while len(buf) - start >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, start)
            end = start + HEADER.size + n
            if len(buf) < end:
                break
            out.append(pickle.loads(buf[start + HEADER.size:end]))
            start = end
        del buf[:start]
        return out


def send(sock: socket.socket, obj: Any) -> None:
    sock.sendall(frame(obj))


def recv(sock: socket.socket) -> Any:
    """The next frame; EOFError when the other side has closed."""
    (n,) = HEADER.unpack(_exactly(sock, HEADER.size))
    return pickle.loads(_exactly(sock, n))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the other side closed the pipe")
        got += k
    return bytes(buf)
