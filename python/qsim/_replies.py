"""What came back from one call, as the Pacer reports it to qsim's core.

The Pacer's driver only *reports*: a return value is a success unless it is
an HTTP response with an error status (``requests``/``httpx``); an
exception with an HTTP status (the ``openai`` SDK's ``APIStatusError``,
``requests.HTTPError``, ``httpx.HTTPStatusError``) is that status with the
response's retry-hint headers and body; any other exception is a failed
exchange (a timeout, a connection error, or anything else), which reaches
the retry layers as status 599, as ``qsim replay`` reports a failed
exchange. The hint itself is read by qsim's one retry-hint reader in Rust
(``retry-after-ms``, ``Retry-After``, body ``retry_after``).
"""

from __future__ import annotations

import json
from typing import Any, List, Optional, Tuple

# The headers passed to the hint reader (the reader decides which count).
HINT_HEADERS = (
    "retry-after-ms",
    "retry-after",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
)
# the first bytes of an error body kept (for its message and a body hint)
BODY_KEEP = 64 * 1024


class Report:
    __slots__ = (
        "ok",
        "status",
        "headers",
        "body",
        "kind",
        "error",
        "input_tokens",
        "output_tokens",
        "finish_reason",
    )

    def __init__(self, ok: bool, status: Optional[int] = None) -> None:
        self.ok = ok
        self.status = status
        self.headers: List[Tuple[str, str]] = []
        self.body: Optional[str] = None
        self.kind: Optional[str] = None
        self.error: Optional[str] = None
        self.input_tokens: Optional[int] = None
        self.output_tokens: Optional[int] = None
        self.finish_reason: Optional[str] = None


def _headers(resp: Any) -> List[Tuple[str, str]]:
    h = getattr(resp, "headers", None)
    if h is None:
        return []
    out = []
    get = getattr(h, "get", None)
    if get is None:
        return out
    for name in HINT_HEADERS:
        try:
            v = get(name)
        except Exception:  # a mapping that refuses: no hint
            v = None
        if v is not None:
            out.append((name, str(v)))
    return out


def _text(resp: Any) -> Optional[str]:
    try:
        t = resp.text
    except Exception:
        return None
    if callable(t):  # aiohttp's coroutine method: not read here
        return None
    if isinstance(t, bytes):
        t = t.decode("utf-8", "replace")
    return t[:BODY_KEEP] if isinstance(t, str) else None


def _message(status: Optional[int], body: Optional[str], fallback: str) -> str:
    msg = None
    if body:
        try:
            v = json.loads(body)
        except ValueError:
            v = None
        if isinstance(v, dict):
            e = v.get("error")
            if isinstance(e, dict) and isinstance(e.get("message"), str):
                msg = e["message"]
            elif isinstance(v.get("message"), str):
                msg = v["message"]
            elif isinstance(e, str):
                msg = e
        if msg is None:
            msg = body
    if msg is None:
        msg = fallback
    msg = " ".join(msg.split())
    if len(msg) > 200:
        msg = msg[:200] + "…"
    return f"HTTP {status}: {msg}" if status is not None else msg


def _usage(res: Any, rep: Report) -> None:
    u = res.get("usage") if isinstance(res, dict) else getattr(res, "usage", None)
    if u is not None:
        get = u.get if isinstance(u, dict) else lambda k: getattr(u, k, None)
        p, c = get("prompt_tokens"), get("completion_tokens")
        rep.input_tokens = p if isinstance(p, int) else None
        rep.output_tokens = c if isinstance(c, int) else None
    ch = res.get("choices") if isinstance(res, dict) else getattr(res, "choices", None)
    if ch:
        try:
            first = ch[0]
        except Exception:
            return
        f = first.get("finish_reason") if isinstance(first, dict) else getattr(first, "finish_reason", None)
        rep.finish_reason = f if isinstance(f, str) else None


def from_result(res: Any) -> Report:
    """A return value: a success, unless an HTTP response with an error status."""
    status = getattr(res, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        rep = Report(False, status)
        rep.kind = "status"
        rep.headers = _headers(res)
        rep.body = _text(res)
        rep.error = _message(status, rep.body, "")
        return rep
    rep = Report(True, status if isinstance(status, int) and not isinstance(status, bool) else 200)
    _usage(res, rep)
    return rep


def _named(e: BaseException, *words: str) -> bool:
    return any(any(w in c.__name__ for w in words) for c in type(e).__mro__)


def from_exception(e: BaseException) -> Report:
    """An exception: its HTTP status if it carries one, else a failed exchange."""
    status = getattr(e, "status_code", None)
    resp = getattr(e, "response", None)
    if not isinstance(status, int) and resp is not None:
        status = getattr(resp, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400:
        rep = Report(False, status)
        rep.kind = "status"
        rep.headers = _headers(resp) if resp is not None else _headers(e)
        body = _text(resp) if resp is not None else None
        if body is None:
            b = getattr(e, "body", None)
            if isinstance(b, (dict, list)):
                body = json.dumps(b)
            elif isinstance(b, str):
                body = b[:BODY_KEEP]
        rep.body = body
        rep.error = _message(status, body, str(e))
        return rep
    rep = Report(False, None)
    if isinstance(e, TimeoutError) or _named(e, "Timeout"):
        rep.kind = "timeout"
    elif isinstance(e, ConnectionError) or _named(e, "Connection", "ConnectError"):
        rep.kind = "connect"
    else:
        rep.kind = "exception"
    text = str(e)
    rep.error = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return rep
