"""What a LiteLLM call attempt was, in vitals' outcome classes (the table is in docs/components.md,
"LiteLLM": keep the two in step).

The classification reads the exception LiteLLM hands to its failure callbacks: its type, its
`status_code`, the headers of the upstream's response, and for connection errors the text of the
exception and its causes (LiteLLM wraps httpx's errors; a refused connection and a connection
dropped mid-response are both an `APIConnectionError`)."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass

SUCCESS = "SUCCESS"
TIMEOUT = "TIMEOUT"
CONNECT_ERROR = "CONNECT_ERROR"
CONNECTION_DROPPED = "CONNECTION_DROPPED"
RATE_LIMITED = "RATE_LIMITED"
SERVER_ERROR = "SERVER_ERROR"
CLIENT_ERROR = "CLIENT_ERROR"
INVALID_RESPONSE = "INVALID_RESPONSE"
CANCELLED = "CANCELLED"

# Transport errors, by the type names of the exception or its causes (LiteLLM wraps httpx's and
# aiohttp's errors, and a refused connection reaches the callback as an InternalServerError 500).
_CONNECT_TYPES = frozenset({
    "connecterror", "clientconnectorerror", "connectionrefusederror", "connecttimeout",
    "clientconnectordnserror", "gaierror",
})
_TIMEOUT_TYPES = frozenset({
    "timeout", "readtimeout", "writetimeout", "pooltimeout", "timeoutexception", "timeouterror",
    "apitimeouterror", "servertimeouterror",
})
_DROPPED_TYPES = frozenset({
    "readerror", "writeerror", "remoteprotocolerror", "clientpayloaderror", "serverdisconnectederror",
    "transferencodingerror", "connectionreseterror", "brokenpipeerror", "incompleteread",
    "clientoserror", "apiconnectionerror",
})


@dataclass(frozen=True)
class Outcome:
    outcome: str
    http_status: int | None = None
    retry_after_ms: int | None = None


def _chain(exc: BaseException):
    """The exception and its causes (LiteLLM wraps the transport's error), at most 8 deep."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:
        yield e
        nxt = e.__cause__ or e.__context__ or getattr(e, "original_exception", None)
        e = nxt if isinstance(nxt, BaseException) and nxt is not e else None
        seen += 1


def _status(exc: BaseException) -> int | None:
    s = getattr(exc, "status_code", None)
    try:
        s = int(s) if s is not None else None
    except (TypeError, ValueError):
        return None
    return s if s is not None and 100 <= s <= 599 else None


def _headers(exc: BaseException) -> dict:
    """The upstream response's headers as LiteLLM keeps them on the exception (lower-case keys)."""
    found: dict = {}
    for source in (
        getattr(exc, "litellm_response_headers", None),
        getattr(exc, "headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if source:
            try:
                for k, v in dict(source).items():
                    found.setdefault(str(k).lower(), v)
            except (TypeError, ValueError):
                continue
    return found


_DAY_MS = 86_400_000
_UNITS = (("ms", 1), ("h", 3_600_000), ("m", 60_000), ("s", 1000))


def ratelimit_reset_ms(value) -> int | None:
    """An `x-ratelimit-reset-*` value in milliseconds: OpenAI's durations (`20ms`, `1s`, `6m0s`,
    `1h2m3.5s`) or plain seconds; None for anything else or past a day (as vitals_gateways'
    `ratelimit_reset_ms`)."""
    v = str(value).strip()
    if not v or len(v) > 24:
        return None
    try:
        secs = float(v)
        return round(secs * 1000) if 0 <= secs <= 86_400 else None
    except ValueError:
        pass
    total, rest = 0.0, v
    while rest:
        n = 0
        while n < len(rest) and (rest[n].isdigit() or rest[n] == "."):
            n += 1
        if n == 0:
            return None
        try:
            number = float(rest[:n])
        except ValueError:
            return None
        rest = rest[n:]
        for unit, ms in _UNITS:
            if rest.startswith(unit):
                total += number * ms
                rest = rest[len(unit):]
                break
        else:
            return None
    return round(total) if total <= _DAY_MS else None


def limit_lifts_in_ms(headers: dict, now: float | None = None) -> int | None:
    """When a 429's limit lifts: its Retry-After, else the `x-ratelimit-reset-*` of the limit that
    ran out (by `x-ratelimit-remaining-*`; the later of requests and tokens when they do not say)."""
    ms = retry_after_ms(headers, now)
    if ms is not None:
        return ms

    def reset(kind):
        v = headers.get(f"x-ratelimit-reset-{kind}")
        return None if v is None else ratelimit_reset_ms(v)

    def out(kind):
        try:
            return float(str(headers.get(f"x-ratelimit-remaining-{kind}")).strip()) <= 0
        except ValueError:
            return False

    requests, tokens = out("requests"), out("tokens")
    if requests and not tokens:
        return reset("requests")
    if tokens and not requests:
        return reset("tokens")
    found = [r for r in (reset("requests"), reset("tokens")) if r is not None]
    return max(found) if found else None


def _within_a_day(ms: float) -> int | None:
    """`ms` rounded, if it is a delay within a day (not negative, not NaN, not infinite)."""
    return round(ms) if 0 <= ms <= _DAY_MS else None


def retry_after_ms(headers: dict, now: float | None = None) -> int | None:
    """A Retry-After header (seconds, or an HTTP date) in milliseconds; `retry-after-ms` first
    (milliseconds, as the Rust bridges read it: within a day, else passed over)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            exact = _within_a_day(float(str(ms).strip()))
        except (TypeError, ValueError):
            exact = None
        if exact is not None:
            return exact
    value = headers.get("retry-after")
    if value is None:
        return None
    value = str(value).strip()
    try:
        # Seconds: a number within a day (`inf` or `1e400` passed over, not an overflow).
        return _within_a_day(float(value) * 1000)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0, int((when - (now if now is not None else time.time())) * 1000))


def classify(exc: BaseException | None) -> Outcome | None:
    """The outcome of an attempt that raised `exc` (None: it succeeded). None when the failure is
    LiteLLM's own, not the deployment's (its rate limiter, a budget, a guardrail): such an attempt
    never reached the upstream and says nothing about its health."""
    if exc is None:
        return Outcome(SUCCESS, 200)
    names = [type(e).__name__.lower() for e in _chain(exc)]
    status = _status(exc)
    headers = _headers(exc)
    name = names[0]
    if name == "ratelimiterror" or status == 429:
        category = str(getattr(exc, "category", "") or "")
        if category.startswith("litellm"):
            return None  # LiteLLM's own limiter refused it: the upstream was never asked
        return Outcome(RATE_LIMITED, 429, limit_lifts_in_ms(headers))
    if name in ("budgetexceedederror", "guardrailraisedexception", "blockedpiientityerror",
                "modifyresponseexception", "sensitivedatarouteexception"):
        return None
    if "cancellederror" in names:
        return Outcome(CANCELLED, status)
    # Transport first: what the exception wraps says more than the status LiteLLM gave it.
    if _CONNECT_TYPES.intersection(names):
        return Outcome(CONNECT_ERROR, None)
    if _TIMEOUT_TYPES.intersection(names) or status == 408:
        return Outcome(TIMEOUT, None)  # no answer arrived (LiteLLM calls its own timeout a 408)
    if _DROPPED_TYPES.intersection(names) or name == "midstreamfallbackerror":
        return Outcome(CONNECTION_DROPPED, None)
    if name in ("apiresponsevalidationerror", "jsonschemavalidationerror", "jsondecodeerror"):
        return Outcome(INVALID_RESPONSE, status)
    if status is not None and status >= 500:
        return Outcome(SERVER_ERROR, status, retry_after_ms(headers) if status == 503 else None)
    if status is not None and status >= 400:
        return Outcome(CLIENT_ERROR, status)
    # An error with no status from the upstream: counted against it as a server error.
    return Outcome(SERVER_ERROR, None)
