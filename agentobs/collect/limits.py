"""Bounds shared by the OTLP transports: the bytes of request bodies in flight, the bearer check.

``ByteBudget`` caps the request bodies being read, decoded or committed at once (both transports draw on
one budget): a request that does not fit is refused with 429 / RESOURCE_EXHAUSTED and a retry delay
before its body is read (HTTP) or decoded (gRPC), so memory follows ``receiver_max_inflight_mb`` and
not the offered load.
"""

from __future__ import annotations

import hmac
import threading


class ByteBudget:
    def __init__(self, limit: int, gauge=None):
        self.limit = limit
        self.used = 0
        self._gauge = gauge
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes; False when they do not fit. One request larger than the whole budget is
        still admitted when nothing else is in flight (it is bounded by the body limit)."""
        with self._lock:
            if self.used and self.used + n > self.limit:
                return False
            self.used += n
            if self._gauge is not None:
                self._gauge.set(self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n
            if self._gauge is not None:
                self._gauge.set(self.used)


def bearer_ok(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC 9110 §11.1), the token compared
    in constant time."""
    scheme, _, cred = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), token.encode())
