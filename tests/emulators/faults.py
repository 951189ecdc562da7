"""Faults an emulator injects on demand, shared by every emulator.

A rule is a regular expression searched in "METHOD /path?query", a fault and how many matching
requests it hits (None = until cleared). Rules are consulted in the order they were added; the
first one that matches and still has hits left is consumed. Thread-safe: tests add rules while
the server's threads take them.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Literal, get_args

Kind = Literal["status", "reset", "slow", "truncate", "corrupt", "page"]
PAGE_TYPE = "text/html; charset=UTF-8"
LOGIN_PAGE = (b"<html><head><title>Single Sign-On - Login</title></head>"
              b"<body><h1>Please log in</h1><br><form action=/login></form></body></html>")


@dataclass(frozen=True)
class Fault:
    """What goes wrong: an HTTP error, a reset connection, a delay, a body cut short or altered, another page
    in the answer's place."""

    kind: Kind
    status: int = 503
    retry_after: str | None = None
    seconds: float = 0.0
    keep: float = 0.5
    body: bytes = b""
    content_type: str = ""

    @classmethod
    def http(cls, status: int, retry_after: str | int | None = None) -> "Fault":
        """Answer `status` (401, 403, 429, 500, 503, ...), with a Retry-After header if given."""
        return cls("status", status=status, retry_after=None if retry_after is None else str(retry_after))

    @classmethod
    def reset(cls) -> "Fault":
        """Close the connection with a TCP reset before answering."""
        return cls("reset")

    @classmethod
    def slow(cls, seconds: float) -> "Fault":
        """Wait `seconds` before answering (read timeouts)."""
        return cls("slow", seconds=seconds)

    @classmethod
    def truncate(cls, keep: float = 0.5) -> "Fault":
        """Announce the full Content-Length, send only the `keep` fraction of the body, then close."""
        return cls("truncate", keep=keep)

    @classmethod
    def corrupt(cls) -> "Fault":
        """Send a body of the right length with one byte changed (a fixity failure)."""
        return cls("corrupt")

    @classmethod
    def page(cls, body: bytes = LOGIN_PAGE, content_type: str = PAGE_TYPE) -> "Fault":
        """Answer 200 with `body` instead (a proxy's login or maintenance page in front of the server)."""
        return cls("page", body=body, content_type=content_type)

    @classmethod
    def from_dict(cls, data: dict) -> "Fault":
        """The control endpoint's JSON form: {"fault": "status", "status": 503, "retry_after": 2, ...}."""
        kind = data["fault"]
        if kind not in get_args(Kind):
            raise ValueError(f"unknown fault {kind!r}")
        retry_after = data.get("retry_after")
        return cls(kind, status=int(data.get("status", 503)),
                   retry_after=None if retry_after is None else str(retry_after),
                   seconds=float(data.get("seconds", 0.0)), keep=float(data.get("keep", 0.5)),
                   body=data.get("body", LOGIN_PAGE.decode()).encode(),
                   content_type=data.get("content_type", PAGE_TYPE))


@dataclass
class _Rule:
    pattern: re.Pattern
    fault: Fault
    remaining: int | None


class FaultInjector:
    def __init__(self) -> None:
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()

    def inject(self, pattern: str, fault: Fault, times: int | None = 1) -> None:
        """Make the next `times` requests whose "METHOD /path?query" matches `pattern` fail with `fault`."""
        with self._lock:
            self._rules.append(_Rule(re.compile(pattern), fault, times))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def take(self, method: str, target: str) -> Fault | None:
        line = f"{method} {target}"
        with self._lock:
            for rule in self._rules:
                if rule.pattern.search(line) and (rule.remaining is None or rule.remaining > 0):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return rule.fault
        return None
