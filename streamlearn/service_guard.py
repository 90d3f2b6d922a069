"""The HTTP edge of the query service: what is checked before a route runs.

- :class:`Guard` (ASGI middleware): times every request (``observe``), refuses a request
  without the bearer token (or the dashboard's session cookie) when one is set (401;
  ``/healthz`` and ``/login`` stay open; a browser opening a page gets the login page
  instead of JSON) and a body over ``service.max_body_bytes`` (413, counted as it streams
  in), and reads every body as JSON whatever its declared type;
- :class:`JsonRoute`: a route whose body must be UTF-8 JSON (400 otherwise).

Every refusal is JSON ``{"error": CODE, "detail": ...}`` (:func:`json_error`), but for the
login page.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from .service_auth import SESSION_COOKIE, TOKEN_ENV, BearerToken

__all__ = ["Guard", "JsonRoute", "LOGIN_PATH", "OPEN_PATHS", "TooLarge", "json_error"]

LOGIN_PATH = "/login"  # the dashboard's login (streamlearn.dashboard): the token in, a session cookie out
OPEN_PATHS = ("/healthz", LOGIN_PATH)  # answered without the token


def json_error(status: int, code: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


class Guard:
    """ASGI middleware: times every request into the metrics, refuses a request without
    the bearer token (when one is set; ``/healthz`` stays open) with a JSON 401, and
    bodies over ``max_body_bytes`` with a JSON 413 (counted as they stream in, so a
    missing or false Content-Length does not get past it)."""

    def __init__(self, app, observe: Callable[[str, int, float], None], max_body_bytes: int,
                 token: BearerToken | None, login_page: bytes = b""):
        self.app, self.observe, self.max_body_bytes, self.token = app, observe, max_body_bytes, token
        self.login_page = login_page  # what a browser asking for a page gets instead of a JSON 401

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = _as_json(scope)
        start, status = time.perf_counter(), [500]
        received = [0]

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > self.max_body_bytes:
                    raise _body_too_large(self.max_body_bytes)
            return message

        async def tracking_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                status[0] = refusal.status_code
                await refusal(scope, receive, send)
            else:
                await self.app(scope, limited_receive, tracking_send)
        finally:
            self.observe(scope.get("path", ""), status[0], time.perf_counter() - start)

    def _refusal(self, scope) -> JSONResponse | None:
        """The answer to a request refused before it is read, or None."""
        if self.token is not None and scope.get("path") not in OPEN_PATHS:
            given = _header(scope, b"authorization")
            if not (self.token.accepts(given) or self.token.accepts_session(_cookie(scope, SESSION_COOKIE))):
                if self.login_page and given is None and _wants_page(scope):
                    return HTMLResponse(self.login_page, status_code=401,  # every 401 names its scheme
                                        headers={"cache-control": "no-store",
                                                 "WWW-Authenticate": 'Bearer realm="streamlearn"'})
                return _unauthorized(given)
        if _declared_length(scope) > self.max_body_bytes:
            too_large = _body_too_large(self.max_body_bytes)
            return json_error(too_large.status_code, too_large.code, too_large.detail)
        return None


def _unauthorized(given: bytes | None) -> JSONResponse:
    scheme = (given or b"").strip().partition(b" ")[0]
    if given is not None and scheme.lower() != b"bearer":  # was: called a wrong token, right or not
        named = b" " in given.strip() and re.fullmatch(rb"[A-Za-z-]{1,20}", scheme)
        shown = scheme.decode() if named else "none"  # never echo what may be the token itself
        detail = (f"the Authorization header's scheme is {shown!r}, not Bearer: send 'Authorization: Bearer TOKEN' "
                  f"with the token the service was started with (--token-file or {TOKEN_ENV})")
        challenge = 'Bearer realm="streamlearn", error="invalid_request"'
    elif given is not None:
        detail = ("the bearer token is not this service's: send the token it was started with "
                  f"(--token-file or {TOKEN_ENV}) as 'Authorization: Bearer TOKEN'")
        challenge = 'Bearer realm="streamlearn", error="invalid_token"'
    else:
        detail = ("this service needs a bearer token: send 'Authorization: Bearer TOKEN' with the token "
                  f"it was started with (--token-file or {TOKEN_ENV})")
        challenge = 'Bearer realm="streamlearn"'
    return json_error(401, "unauthorized", detail, headers={"WWW-Authenticate": challenge})


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


def _cookie(scope, name: str) -> bytes | None:
    """The value of cookie ``name`` in the request's Cookie headers, or None."""
    for key, value in scope.get("headers", ()):
        if key == b"cookie":
            for pair in value.split(b";"):
                k, _, v = pair.strip().partition(b"=")
                if k == name.encode():
                    return v
    return None


def _wants_page(scope) -> bool:
    """A browser navigating (GET, HTML accepted), not a script calling the API."""
    return scope.get("method") == "GET" and b"text/html" in (_header(scope, b"accept") or b"")


class TooLarge(StarletteHTTPException):
    """A 413 with its error code. Raised while the body streams in too: FastAPI passes
    HTTP exceptions through its body parsing, so the error handlers answer it."""

    def __init__(self, code: str, detail: str):
        super().__init__(413, detail)
        self.code = code


def _body_too_large(limit: int) -> TooLarge:
    return TooLarge("body-too-large", f"request body over {limit} bytes (service.max_body_bytes): send "
                     "smaller batches or raise the limit")


def _as_json(scope):
    """Every body this API takes is JSON, so every body is read as JSON whatever its
    declared type: ``curl localhost:8000/v1/predict -d '{"text": "hi"}'`` (which declares
    a form) works as pasted, and a body that is not JSON is a 400 whatever it claims."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class JsonRoute(APIRoute):
    """A route whose body must be UTF-8 JSON (RFC 8259 8.1): a body that is empty or not
    UTF-8 is refused with a 400 before parsing, since Python's ``json.loads`` would guess
    UTF-16 or UTF-32 and accept it."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            _check_utf8_json(await request.body())  # kept by the request: parsed once, below
            return await handler(request)

        return checked


def _check_utf8_json(body: bytes) -> None:
    if not body:
        raise StarletteHTTPException(400, 'the body is empty: send a JSON object such as {"text": "..."}')
    # ASCII in UTF-16 or UTF-32 is valid UTF-8 but holds NUL bytes, which JSON text never does.
    wide = b"\x00" in body[:4] or body[:2] in (b"\xff\xfe", b"\xfe\xff")
    try:
        body.decode("utf-8")
        position = body.find(b"\x00")
    except UnicodeDecodeError as exc:
        position = exc.start
    if position >= 0:
        hint = " (it looks like UTF-16 or UTF-32)" if wide else ""
        raise StarletteHTTPException(
            400, f"the body is not UTF-8{hint}: invalid byte at position {position}; send JSON encoded as UTF-8")


def _declared_length(scope) -> int:
    try:
        return int(_header(scope, b"content-length") or 0)
    except ValueError:
        return 0
