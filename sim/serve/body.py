"""A request body read safely: every hostile body is a 400 in OpenAI's error format.

Why its own module: the HTTP layer must never die of what a client sends.
Invalid UTF-8, a lone surrogate escape, NaN or Infinity, an integer of more
than 4300 digits (Python refuses to parse it), and JSON nested deeper than
MAX_DEPTH each become an ApiError naming the fault, and the nesting is checked
without recursion. A duplicated key keeps its last value, as Python's parser,
and so vLLM's, keeps it.
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # deeper JSON is refused: no request field nests near this
_ECHO = reprlib.Repr()
_ECHO.maxstring, _ECHO.maxother, _ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxdict = 60, 60, 3, 6, 4


@dataclass(frozen=True, slots=True)
class ApiError(Exception):
    """An OpenAI-style error: `status` (HTTP), a message, its type and the field at fault."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


def echo(value: object) -> str:
    """A value as an error message quotes it: at most ~60 characters, shallow."""
    return _ECHO.repr(value)


def utf8(text: str, field: str) -> str:
    """A string a JSON escape made undecodable (a lone surrogate) is a 400, not a crash."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{field}: contains a lone surrogate (\\ud800-\\udfff), which is "
                            "not valid Unicode text", param=field) from None
    return text


def depth_ok(value: object) -> bool:
    """Nesting within MAX_DEPTH, checked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return True


def parse_body(raw: bytes) -> object:
    """The request's JSON: strict UTF-8, bounded nesting, NaN and Infinity refused; a
    duplicated key keeps its last value (as Python's and so vLLM's parser does)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {err.start})") from None

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not a JSON number")

    try:
        body = json.loads(text, parse_constant=constant)
    except RecursionError:
        raise ApiError(400, f"the request body is nested deeper than {MAX_DEPTH} levels") \
            from None
    except ValueError as err:  # JSONDecodeError, and integers of more than 4300 digits
        raise ApiError(400, f"the request body is not valid JSON: {echo(str(err))}") from None
    if not depth_ok(body):
        raise ApiError(400, f"the request body is nested deeper than {MAX_DEPTH} levels")
    return body
