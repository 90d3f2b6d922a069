"""The dashboard of ``streamlearn serve``: the page at ``/`` and the data it polls.

- ``GET /``: one page (``streamlearn/web/``: HTML, a small script that draws its charts
  as SVG, a style sheet; nothing from the internet), served with the package.
- ``GET /v1/dashboard?since=COMMITS``: the snapshot's step and freshness; and, when the
  store committed since ``COMMITS``, the worker's live history (``points``, as the
  worker committed them: :mod:`streamlearn.consumers.live`) and the model card (task,
  the configuration, tables with their sizes and fill, labels seen).

With a service token (``--token-file``), the page and its data need it like every other
endpoint: a browser opening ``/`` without it gets a login page (:func:`login_page`), which
posts the token to ``POST /login`` for a session cookie derived from it
(:mod:`streamlearn.service_auth`).

The page polls once a second. The history moves when the worker checkpoints (it is
committed with the checkpoints, so ``serve`` stays a separate process that only reads the
state, and a restarted worker continues it). Reads use their own read-only handle of the
store in a thread, never the snapshot's lock: a slow query does not stall the page.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from importlib import resources
from typing import Any, Callable

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from .checkpoint import as_it_runs, read_live, stored_labels
from .config import Config
from .service_auth import SESSION_COOKIE, BearerToken
from .service_guard import LOGIN_PATH, JsonRoute, json_error
from .state import open_store
from .tasks import task_defaults

__all__ = ["CARD_KEYS", "TASK_CARD_KEYS", "card_keys", "Dashboard", "add_dashboard_routes", "login_page"]

# The configuration a model card shows first: what the model is and how big, then what
# the task's own defaults set (its head, count part, ...: card_keys), then the keys only one
# task reads; the page lists every other key that differs from the task's defaults after them.
CARD_KEYS = (
    "learner.task", "embedding.scheme", "embedding.K", "embedding.B", "embedding.d", "embedding.k",
    "model.layers", "model.d_model", "hashing.tokenizer", "hashing.max_tokens", "learner.batch_size",
    "optim.sparse", "optim.sparse_lr", "optim.dense_lr",
    "worker.checkpoint_every", "worker.checkpoint_seconds", "worker.eval_every",
)
TASK_CARD_KEYS = {"classify": ("hashing.ngrams", "hashing.shapes", "learner.nb_weight"),
                  "next-item": ("learner.history", "learner.recency", "learner.key_token")}
CARD_SECONDS = 10.0  # the card's table fill counts every stored row: at most this often
MAX_LABELS_SHOWN = 200
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
_NO_STORE = {"cache-control": "no-store"}


def _asset(name: str) -> bytes:
    return resources.files("streamlearn").joinpath("web", name).read_bytes()


@dataclasses.dataclass
class _Cached:
    commits: int = -1
    points: list = dataclasses.field(default_factory=list)
    card: dict | None = None
    card_at: float = 0.0


class Dashboard:
    """What ``/v1/dashboard`` answers, from a read-only handle of the state directory.
    ``read(since)`` is blocking (call it in a thread); ``close()`` releases the handle."""

    def __init__(self, state: str):
        self._store = open_store(state, readonly=True, backend="lmdb")
        self._lock = threading.Lock()
        self._cached = _Cached()

    def close(self) -> None:
        self._store.close()

    def read(self, since: int | None = None) -> dict[str, Any]:
        """The manifest's step, commit time and commit count; with the history and the
        card unless ``since`` is the current commit count (nothing new)."""
        with self._lock:
            with self._store.snapshot():
                manifest = self._store.manifest()
                if manifest.commits != self._cached.commits:
                    self._cached.points = [{"n": n, **figures} for n, figures in read_live(self._store)]
                    self._cached.commits = manifest.commits
                    self._refresh_card(manifest, force=self._cached.card is None)
            body = {"commits": manifest.commits, "snapshot_step": manifest.step,
                    "committed_at": manifest.committed_at, "freshness_seconds": _age(manifest.committed_at),
                    "totals": manifest.metrics or {}}
            if since == manifest.commits:
                return {**body, "unchanged": True}
            return {**body, "unchanged": False, "points": self._cached.points, "card": self._cached.card}

    def _refresh_card(self, manifest, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._cached.card_at < CARD_SECONDS:
            return
        self._cached.card = model_card(manifest, self._store.stats()["tables"], stored_labels(self._store))
        self._cached.card_at = now


def model_card(manifest, table_stats: dict[str, dict], labels: list) -> dict[str, Any]:
    """Task, configuration (:data:`CARD_KEYS`, then the other keys that differ from the
    task's defaults), tables (rows x width, bytes, rows stored: the fill), labels seen."""
    config = as_it_runs(manifest.config or {})  # keys older than the state: as the model runs them
    task = (config.get("learner") or {}).get("task")
    flat = {f"{s}.{k}": v for s, values in config.items() if isinstance(values, dict) for k, v in values.items()}
    defaults = _defaults(task)
    shown = card_keys(task)
    tables = [{"name": name, "rows": spec.rows, "width": spec.width,
               "bytes": spec.rows * spec.row_bytes, "stored": table_stats.get(name, {}).get("stored", 0)}
              for name, spec in sorted(manifest.tables.items())]
    return {
        "task": task,
        "config": {key: flat[key] for key in shown if key in flat},
        "changed": {key: value for key, value in sorted(flat.items())
                    if key not in shown and key in defaults and defaults[key] != value},
        "tables": tables,
        "labels": [str(label) for label in labels[:MAX_LABELS_SHOWN]],
        "labels_seen": len(labels),
    }


def card_keys(task: str | None) -> tuple[str, ...]:
    """The keys task ``task``'s card shows first, in order: :data:`CARD_KEYS`, the keys
    its defaults set (``streamlearn.tasks.task_defaults``), :data:`TASK_CARD_KEYS`.

    >>> card_keys("next-token")[-3:]
    ('model.recent_pairs', 'model.ffn', 'learner.double_batch_after')
    >>> card_keys("next-item")[-3:]
    ('learner.history', 'learner.recency', 'learner.key_token')
    """
    own = [item.split("=", 1)[0] for item in task_defaults(task)] if task else []
    return tuple(dict.fromkeys([*CARD_KEYS, *own, *TASK_CARD_KEYS.get(task, ())]))


def _defaults(task: str | None) -> dict[str, Any]:
    try:
        cfg = Config.from_dict({"learner": {"task": task}}) if task else Config()
    except Exception:  # a task this version does not know: no defaults to compare with
        return {}
    return {f"{s}.{k}": v for s, values in cfg.to_dict().items() for k, v in values.items()}


def _age(at: float | None) -> float | None:
    return None if at is None else max(0.0, time.time() - at)


def login_page() -> bytes:
    """The page a browser gets instead of the dashboard without the service's token: it
    posts the token to ``/login`` (:func:`add_dashboard_routes`) and reloads."""
    return _asset("login.html")


def add_dashboard_routes(app: FastAPI, dashboard: Dashboard, check: Callable[[], None],
                         token: BearerToken | None = None) -> None:
    """``GET /`` (the page), ``GET /ui/{asset}`` (its script and style sheet),
    ``GET /v1/dashboard`` (its data, after ``check()``: the state directory is still the
    one opened) and, with a ``token``, ``POST /login`` (the token in a JSON body -> the
    session cookie a browser sends instead of a bearer header)."""
    page = _asset("index.html")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=_NO_STORE)

    @app.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            return JSONResponse({"error": "not-found", "detail": f"no asset {name!r}"}, status_code=404)
        return Response(_asset(name), media_type=ASSETS[name], headers=_NO_STORE)

    @app.get("/v1/dashboard")
    async def data(since: int | None = Query(None, description="the `commits` of the last answer: "
                                             "history and card are left out when nothing was committed since")) -> dict:
        """The dashboard's data: snapshot step and freshness, the worker's live history
        (``points``) and the model card (``card``)."""
        return await asyncio.to_thread(_checked, check, dashboard.read, since)

    if token is not None:
        _add_login(app, token)


def _checked(check: Callable[[], None], read: Callable[..., Any], *args: Any) -> Any:
    check()
    return read(*args)


class _Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: StrictStr = Field(max_length=4096)


def _add_login(app: FastAPI, token: BearerToken) -> None:
    router = APIRouter(route_class=JsonRoute)

    @router.post(LOGIN_PATH, include_in_schema=False)
    async def login(body: _Login) -> JSONResponse:
        if not token.accepts(b"Bearer " + body.token.encode("utf-8", "replace")):
            return json_error(401, "unauthorized", "that is not this service's token: give the token streamlearn "
                              "serve was started with (--token-file or STREAMLEARN_SERVE_TOKEN)")
        response = JSONResponse({"status": "ok"}, headers=_NO_STORE)
        response.set_cookie(SESSION_COOKIE, token.session(), httponly=True, samesite="strict", path="/")
        return response

    app.include_router(router)
