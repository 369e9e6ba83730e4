"""The failure classes every layer records, and the response header that carries them.

A rollout crosses three hops (collector -> agent -> model server -> upstream API); the failure a
user needs to see in ``_failures.jsonl`` is the one at the far end (a rate limit, a reset, a reply
too large), not the ``HTTP 500`` each hop would otherwise wrap it in. So the class is named once,
where the failure happens, and travels back in the ``x-polygym-failure`` response header; every
polygym caller keeps it (``ServerCallError.error_class``).

The header also says the failure is *final*: the callee already spent the call chain's retry
budget on it, so a caller must not retry it again (retries would multiply hop by hop otherwise).

``Timeout`` keeps its historical spelling; a callee's own error without a class is ``HTTP <status>``.
"""

from __future__ import annotations

from collections.abc import Mapping

FAILURE_HEADER = "x-polygym-failure"

TIMEOUT = "Timeout"
CONNECTION_REFUSED = "ConnectionRefused"
"""The request provably never arrived (nothing listening, DNS failure)."""
CONNECTION_RESET = "ConnectionReset"
"""The connection broke after the request was sent, possibly mid-reply."""
RATE_LIMITED = "RateLimited"
UPSTREAM_5XX = "Upstream5xx"
UPSTREAM_4XX = "Upstream4xx"
BAD_JSON = "BadJSON"
RESPONSE_TOO_LARGE = "ResponseTooLarge"

_CLASS_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _-.")
_MAX_CLASS_LEN = 64


def upstream_status_class(status: int) -> str:
    """The class of an upstream API's error status (for a model server relaying it)."""
    if status == 429:
        return RATE_LIMITED
    if status in (408, 504):
        return TIMEOUT
    return UPSTREAM_5XX if status >= 500 else UPSTREAM_4XX


def failure_headers(error_class: str) -> dict[str, str]:
    """Response headers marking a final failure of class ``error_class``."""
    return {FAILURE_HEADER: error_class}


def failure_class(headers: Mapping[str, str]) -> str | None:
    """The class a polygym callee put on its reply, or None; anything odd is ignored, since a
    header from the other end of a socket is untrusted and ends up in files and terminals."""
    value = headers.get(FAILURE_HEADER)
    if not value or len(value) > _MAX_CLASS_LEN or not set(value) <= _CLASS_CHARS:
        return None
    return value
