"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with the status the OpenAI API uses
(400 bad input, 401 no or wrong key, 404 unknown model or route, 503 the queue is full or the server is stopping).
The official client raises its BadRequestError / AuthenticationError / NotFoundError / ... from these."""

from __future__ import annotations

from typing import Any

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 500: "internal_server_error", 503: "service_unavailable"}


class APIError(Exception):
    """What a handler raises to answer with an OpenAI error; message is one line."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}
