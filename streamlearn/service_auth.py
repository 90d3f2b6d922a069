"""Optional bearer-token authentication for ``streamlearn serve``: :class:`BearerToken`.

The token comes from a file (``--token-file``) or from the environment variable
``STREAMLEARN_SERVE_TOKEN``, never from a config file or the state directory (a config is
stored in every checkpoint; a state directory is copied around). Every endpoint but
``/healthz`` then needs ``Authorization: Bearer <token>``; the service keeps only the
token's SHA-256 digest and compares digests in constant time, so neither the token nor
its length can be learned from response times. A browser, which cannot send that header
when it opens the dashboard at ``/``, logs in once (``POST /login`` with the token) and
gets a session cookie derived from the token (:meth:`BearerToken.session`).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
from collections.abc import Mapping

from .exceptions import ConfigError

__all__ = ["SESSION_COOKIE", "TOKEN_ENV", "BearerToken", "load_token"]

log = logging.getLogger(__name__)

TOKEN_ENV = "STREAMLEARN_SERVE_TOKEN"
SESSION_COOKIE = "streamlearn_session"  # the dashboard's login: a browser cannot send a bearer header
MIN_TOKEN_CHARS = 16
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750's b64token: what a header may carry as is
_GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class BearerToken:
    """The secret a request must present. Picklable (``serve --workers`` hands it to
    each worker process); its repr shows nothing of it."""

    def __init__(self, token: str):
        if len(token) < MIN_TOKEN_CHARS or not _TOKEN.fullmatch(token):
            raise ConfigError(
                f"the service token must be at least {MIN_TOKEN_CHARS} characters of A-Z a-z 0-9 - . _ ~ + / "
                f"(RFC 6750), got {len(token)} characters: generate one with {_GENERATE}"
            )
        self._digest = _digest(token.encode("ascii"))
        # What a browser holds after logging in to the dashboard: derived from the token, so
        # the cookie jar never holds the token itself (which may open other doors, e.g. curl).
        self._session = hmac.new(self._digest, b"streamlearn dashboard session", hashlib.sha256).hexdigest()

    def accepts(self, authorization: bytes | None) -> bool:
        """Whether an ``Authorization`` header value carries this token (scheme
        ``Bearer``, case-insensitive)."""
        scheme, _, credentials = (authorization or b"").strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(_digest(credentials.strip()), self._digest)

    def session(self) -> str:
        """The value of the :data:`SESSION_COOKIE` a browser gets for the token (``POST
        /login``): HttpOnly, SameSite=Strict, so no other site's page can send it."""
        return self._session

    def accepts_session(self, cookie: bytes | None) -> bool:
        """Whether a :data:`SESSION_COOKIE` value is this token's session (constant time)."""
        return cookie is not None and hmac.compare_digest(cookie, self._session.encode())

    def __repr__(self) -> str:
        return "BearerToken(<hidden>)"


def load_token(token_file: str | None, environ: Mapping[str, str]) -> BearerToken | None:
    """The token of ``token_file`` (surrounding whitespace dropped), or of ``environ``'s
    ``STREAMLEARN_SERVE_TOKEN``; None when neither is set (no authentication). Both set
    is an error: which one is meant cannot be guessed."""
    from_env = environ.get(TOKEN_ENV)
    if token_file is not None and from_env is not None:
        raise ConfigError(f"both --token-file and {TOKEN_ENV} give a service token: keep one")
    if token_file is not None:
        return BearerToken(_read_token_file(token_file))
    if from_env is not None:
        return BearerToken(from_env.strip())
    return None


def _read_token_file(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            token = f.read().strip()
            mode = os.fstat(f.fileno()).st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror}; give a readable file "
                          "holding the token") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the token file {path} is not ASCII: write only the token in it ({_GENERATE})") from exc
    if not token:
        raise ConfigError(f"the token file {path} is empty: write the token in it ({_GENERATE} > {path})")
    if "\n" in token or "\r" in token:  # was: 'must be at least 16 characters ..., got 43 characters'
        raise ConfigError(f"the token file {path} holds more than one line: write only the token in it")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the token file %s is readable by other users: chmod 600 %s", path, path)
    return token


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()
